// B[N,M] = transpose(A[M,N]), row-major; M and N multiples of 32.
// A work-group of TILE x ROWS items moves one TILE x TILE tile through local
// memory, each item TILE / ROWS elements; PAD extra columns keep the column reads
// of the tile off one memory bank. Launch: global = (N, M * ROWS / TILE), local = (TILE, ROWS).
#ifndef TILE
#define TILE 16
#endif
#ifndef ROWS
#define ROWS 16
#endif
#ifndef PAD
#define PAD 0
#endif

__kernel void transpose_space(__global const float *A, __global float *B, const int M, const int N) {
  __local float tile[TILE][TILE + PAD];
  const int tx = get_local_id(0), ty = get_local_id(1);
  const int gx = get_group_id(0) * TILE, gy = get_group_id(1) * TILE;
  for (int j = ty; j < TILE; j += ROWS)
    tile[j][tx] = A[(size_t)(gy + j) * N + gx + tx];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int j = ty; j < TILE; j += ROWS)
    B[(size_t)(gx + j) * M + gy + tx] = tile[tx][j];
}
