"""Figures and tables for eagle2-viz traces: pure functions (no torch, no model code).

    from eagle2.policies.registry import TRACES
    from viz import tree_figure, cycle_table
    tr = TRACES.load("assets/traces/writing-greedy.json")
    tree_figure(tr.steps[3]).show()
"""
from .acceptance_whatif import acceptance_whatif_chart, chain_speedup, chain_tokens, depth_counts
from .charts import (acceptance_histogram, calibration_chart, calibration_data, depth_acceptance, depth_chart,
                     forward_speedup, lossy_summary, metrics, metrics_html, race_chart, speedup_chart,
                     speedup_series)
from .explain import Phase, explain_figure, explain_text, phases
from .phase_chart import measured_why, per_token_ms, phase_chart
from .tables import cycle_table
from .tokens import token_stream_html
from .tree_graph import empty_figure, layout, path_nodes, tree_figure, tree_graph
from .whatif import gpu_model_table, price_run, price_table_from_trace, whatif_chart

__all__ = ["Phase", "acceptance_histogram", "acceptance_whatif_chart", "chain_speedup", "chain_tokens",
           "depth_counts", "calibration_chart", "calibration_data",
           "cycle_table", "depth_acceptance", "depth_chart", "empty_figure", "forward_speedup", "gpu_model_table",
           "lossy_summary", "explain_figure", "explain_text", "layout", "measured_why", "metrics", "metrics_html", "path_nodes",
           "per_token_ms", "phase_chart", "phases", "price_run", "price_table_from_trace", "race_chart",
           "speedup_chart", "speedup_series", "token_stream_html",
           "tree_figure", "tree_graph", "whatif_chart"]
