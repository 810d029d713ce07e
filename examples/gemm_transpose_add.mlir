// C = A[256,512] @ B[512,384]; out[384,256] = transpose(C) + D[384,256] (C read through a transposed indexing map).
#map_2d = affine_map<(i, j) -> (i, j)>
#map_transposed = affine_map<(i, j) -> (j, i)>

func.func @gemm_transpose_add(%A: tensor<256x512xf32>, %B: tensor<512x384xf32>,
                              %D: tensor<384x256xf32>) -> tensor<384x256xf32> {
  %zero = arith.constant 0.0 : f32
  %empty_c = tensor.empty() : tensor<256x384xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty_c : tensor<256x384xf32>) -> tensor<256x384xf32>
  %C = linalg.matmul ins(%A, %B : tensor<256x512xf32>, tensor<512x384xf32>)
                     outs(%acc : tensor<256x384xf32>) -> tensor<256x384xf32>
  %empty = tensor.empty() : tensor<384x256xf32>
  // Iteration space is the output [384,256]; C[j, i] feeds out[i, j].
  %out = linalg.generic {indexing_maps = [#map_transposed, #map_2d, #map_2d],
                         iterator_types = ["parallel", "parallel"]}
      ins(%C, %D : tensor<256x384xf32>, tensor<384x256xf32>)
      outs(%empty : tensor<384x256xf32>) {
  ^bb0(%c: f32, %d: f32, %unused: f32):
    %sum = arith.addf %c, %d : f32
    linalg.yield %sum : f32
  } -> tensor<384x256xf32>
  return %out : tensor<384x256xf32>
}
