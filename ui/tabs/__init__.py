"""One builder per tab: each lays out its tab in the current gr.Blocks context, subscribes its
events to ui.handlers, and returns its components keyed by name."""
