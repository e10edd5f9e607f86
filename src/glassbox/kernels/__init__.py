"""Hand-written kernels and their build: C for the CPU (cpu_kernels.c, built by native.py, bound by
cpu_ops.py) and Triton for CUDA (triton_attention.py). The PyTorch ops in layers/ are their reference."""
