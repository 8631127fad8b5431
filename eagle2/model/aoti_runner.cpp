// run() of a compiled package without the GIL. torch's own Python binding of
// AOTIModelContainerRunnerCpu keeps the GIL through a run, so no other Python thread (another
// session's Step, the page) moves meanwhile. This takes the same runner object (the pybind type
// torch registered) and lets go of the GIL around the call; the graph runs no Python.
#include <torch/extension.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>

using Runner = torch::inductor::AOTIModelContainerRunnerCpu;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", [](Runner& runner, const std::vector<at::Tensor>& inputs) {
    py::gil_scoped_release released;
    return runner.run(inputs);
  });
}
