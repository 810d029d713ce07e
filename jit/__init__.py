"""Device side: device probing, finalisation to native code, loading and running kernels."""
