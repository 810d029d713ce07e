// C[M,N] = A[M,K] @ B[K,N], row-major; M and N multiples of 64, K a multiple of KB.
// A work-group of BX x BY items computes a (BY*TY) x (BX*TX) tile of C: each item
// keeps TY x TX results in registers, and the group stages a (BY*TY) x KB slice of A
// and a KB x (BX*TX) slice of B in local memory per step along K.
// Launch: global = (N / TX, M / TY), local = (BX, BY). The parameters come as -D
// definitions (manifest `tune: params:`); the defaults below are the manifest's `defines:`.
#ifndef BX
#define BX 16
#endif
#ifndef BY
#define BY 16
#endif
#ifndef TX
#define TX 1
#endif
#ifndef TY
#define TY 1
#endif
#ifndef KB
#define KB 16
#endif

__kernel void matmul_space(__global const float *A, __global const float *B,
                           __global float *C, const int M, const int N, const int K) {
  __local float As[BY * TY][KB];
  __local float Bs[KB][BX * TX];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int col0 = get_group_id(0) * (BX * TX), row0 = get_group_id(1) * (BY * TY);
  float acc[TY][TX];
  for (int i = 0; i < TY; ++i)
    for (int j = 0; j < TX; ++j) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += KB) {
    for (int r = ty; r < BY * TY; r += BY)
      for (int c = tx; c < KB; c += BX) As[r][c] = A[(size_t)(row0 + r) * K + k0 + c];
    for (int r = ty; r < KB; r += BY)
      for (int c = tx; c < BX * TX; c += BX) Bs[r][c] = B[(size_t)(k0 + r) * N + col0 + c];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < KB; ++k) {
      float b[TX];
      for (int j = 0; j < TX; ++j) b[j] = Bs[k][tx + j * BX];
      for (int i = 0; i < TY; ++i) {
        const float a = As[ty + i * BY][k];
        for (int j = 0; j < TX; ++j) acc[i][j] += a * b[j];
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int i = 0; i < TY; ++i)
    for (int j = 0; j < TX; ++j)
      C[(size_t)(row0 + ty + i * BY) * N + col0 + tx + j * BX] = acc[i][j];
}
