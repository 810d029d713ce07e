// c = a + b over n floats. The global size is n rounded up to the work-group
// size, so work-items past the end do nothing.
__kernel void vadd(__global const float *a, __global const float *b,
                   __global float *c, const int n) {
  const int i = get_global_id(0);
  if (i < n) c[i] = a[i] + b[i];
}
