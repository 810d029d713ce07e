// out[256,384] = relu(A[256,512] @ B[512,384] + bias[384]) (bias broadcast over rows).
#map_2d = affine_map<(i, j) -> (i, j)>
#map_row = affine_map<(i, j) -> (j)>

func.func @gemm_bias_relu(%A: tensor<256x512xf32>, %B: tensor<512x384xf32>,
                          %bias: tensor<384xf32>) -> tensor<256x384xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<256x384xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<256x384xf32>) -> tensor<256x384xf32>
  %C = linalg.matmul ins(%A, %B : tensor<256x512xf32>, tensor<512x384xf32>)
                     outs(%acc : tensor<256x384xf32>) -> tensor<256x384xf32>
  %out = linalg.generic {indexing_maps = [#map_2d, #map_row, #map_2d],
                         iterator_types = ["parallel", "parallel"]}
      ins(%C, %bias : tensor<256x384xf32>, tensor<384xf32>)
      outs(%empty : tensor<256x384xf32>) {
  ^bb0(%c: f32, %b: f32, %unused: f32):
    %sum = arith.addf %c, %b : f32
    %relu = arith.maximumf %sum, %zero : f32
    linalg.yield %relu : f32
  } -> tensor<256x384xf32>
  return %out : tensor<256x384xf32>
}
