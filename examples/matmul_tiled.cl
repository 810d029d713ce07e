// C[M,N] = A[M,K] @ B[K,N], row-major, any M, N, K.
// Each 16x16 work-group computes one 16x16 tile of C, staging 16x16 tiles of
// A and B in local memory; tiles that overhang the matrices are zero-padded.
// Launch: global = (round_up(N, 16), round_up(M, 16)), local = (16, 16).
#define TILE 16

__kernel __attribute__((reqd_work_group_size(TILE, TILE, 1)))
void matmul_tiled(__global const float *A, __global const float *B,
                  __global float *C, const int M, const int N, const int K) {
  __local float As[TILE][TILE];
  __local float Bs[TILE][TILE];
  const int lx = get_local_id(0), ly = get_local_id(1);
  const int col = get_global_id(0), row = get_global_id(1);
  float acc = 0.0f;
  for (int t = 0; t < K; t += TILE) {
    const int ka = t + lx, kb = t + ly;
    As[ly][lx] = (row < M && ka < K) ? A[(size_t)row * K + ka] : 0.0f;
    Bs[ly][lx] = (kb < K && col < N) ? B[(size_t)kb * N + col] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = 0; k < TILE; ++k) acc += As[ly][k] * Bs[k][lx];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (row < M && col < N) C[(size_t)row * N + col] = acc;
}
