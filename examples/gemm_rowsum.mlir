// C = A[256,512] @ B[512,384]; out[256] = sum over columns of C (row sums).
#map_2d = affine_map<(i, j) -> (i, j)>
#map_row = affine_map<(i, j) -> (i)>

func.func @gemm_rowsum(%A: tensor<256x512xf32>, %B: tensor<512x384xf32>) -> tensor<256xf32> {
  %zero = arith.constant 0.0 : f32
  %empty_c = tensor.empty() : tensor<256x384xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty_c : tensor<256x384xf32>) -> tensor<256x384xf32>
  %C = linalg.matmul ins(%A, %B : tensor<256x512xf32>, tensor<512x384xf32>)
                     outs(%acc : tensor<256x384xf32>) -> tensor<256x384xf32>
  %empty = tensor.empty() : tensor<256xf32>
  %init = linalg.fill ins(%zero : f32) outs(%empty : tensor<256xf32>) -> tensor<256xf32>
  %out = linalg.generic {indexing_maps = [#map_2d, #map_row],
                         iterator_types = ["parallel", "reduction"]}
      ins(%C : tensor<256x384xf32>)
      outs(%init : tensor<256xf32>) {
  ^bb0(%c: f32, %running: f32):
    %sum = arith.addf %running, %c : f32
    linalg.yield %sum : f32
  } -> tensor<256xf32>
  return %out : tensor<256xf32>
}
