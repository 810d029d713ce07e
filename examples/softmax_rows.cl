// Row-wise softmax of X[rows, cols]: one work-group of WG items per row,
// with tree reductions in local memory for the row's maximum and sum.
// Launch: global = (rows * WG,), local = (WG,).
#define WG 128

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax_rows(__global const float *X, __global float *Y, const int cols) {
  __local float red[WG];
  const int lid = get_local_id(0);
  __global const float *x = X + (size_t)get_group_id(0) * cols;
  __global float *y = Y + (size_t)get_group_id(0) * cols;

  float m = -INFINITY;
  for (int j = lid; j < cols; j += WG) m = fmax(m, x[j]);
  red[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);

  float sum = 0.0f;
  for (int j = lid; j < cols; j += WG) sum += exp(x[j] - m);
  red[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / red[0];
  for (int j = lid; j < cols; j += WG) y[j] = exp(x[j] - m) * inv;
}
