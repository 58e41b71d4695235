"""torchref: an independent PyTorch implementation of the model family
actplace compiles (model.py), our training step in PyTorch terms (train.py)
and a dependency-free safetensors reader/writer (safetensors_io.py). Used by
the gradient oracle (test/e2e/grad_oracle.py) and GPU peer benchmarks."""
