"""perf/profile_step.py, as docs/examples/perf-gate.yml runs it: profile one training step
and save the report, its trace with its timed samples, where `gpuprof compare` reads it.

    python perf/profile_step.py build/step.json.gz

Replace the model and the step with your own; keep the shapes and the seed fixed, so every
run measures the same work.
"""

import sys

import torch

import gpuprof_nb


def main(out: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier on a shared runner; use what production uses
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))

    def train_step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    report = gpuprof_nb.profile_function(train_step, repeat=10)
    report.save(out)
    print(f"{out}: median {report.timing.median_us:.0f} us per step, {report.timing.runs} samples")


if __name__ == "__main__":
    main(sys.argv[1])
