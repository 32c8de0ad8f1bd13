"""Functional norms on every backend: the matrix, gradcheck, compiled, C++ and Triton kernels."""
