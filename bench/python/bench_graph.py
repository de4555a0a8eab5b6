"""The Python side of bench/gpu.py: the same training step (TorchScript MLP, Adam, MSE, the loss
read every step) in PyTorch eager, and as one whole-step CUDA graph (torch.cuda.graph, Adam with
capturable=True: PyTorch's recipe for capturing the optimizer). Prints
    RESULT <microseconds per step> <loss of the last step>
Usage: python bench_graph.py <model.pt> <features> <batch> <cuda|cpu> <eager|graph> <warm-up> <steps>"""

import sys
import time

import torch


def main(argv):
    path, features, batch, device, mode, warmup, steps = argv
    features, batch, warmup, steps = int(features), int(batch), int(warmup), int(steps)
    i = torch.arange(1, batch + 1, dtype=torch.float32)[:, None]
    j = torch.arange(1, features + 1, dtype=torch.float32)[None, :]
    x = torch.sin(0.01 * i * j).to(device)
    y = torch.cos(0.02 * i + 0.03 * j).to(device)
    model = torch.jit.load(path, map_location=device)
    model.train()
    graph = mode == "graph"
    # PyTorch's default implementation (on CUDA its multi-tensor foreach kernels), as users run it.
    optim = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=graph)

    def step():
        optim.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optim.step()
        return loss

    if not graph:
        for k in range(warmup + steps):
            if k == warmup:
                t0 = time.perf_counter()
            value = step().item()
        seconds = time.perf_counter() - t0
    else:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        optim.zero_grad(set_to_none=True)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_loss = torch.nn.functional.mse_loss(model(x), y)
            static_loss.backward()
            optim.step()
        for k in range(warmup + steps):
            if k == warmup:
                t0 = time.perf_counter()
            g.replay()
            value = static_loss.item()
        seconds = time.perf_counter() - t0
    print(f"RESULT {1e6 * seconds / steps:.6e} {value:.6e}")


if __name__ == "__main__":
    main(sys.argv[1:])
