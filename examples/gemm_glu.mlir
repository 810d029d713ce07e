// C = A[256,512] @ B[512,768]; out[256,384] = C[:, :384] * sigmoid(C[:, 384:]) (gated linear unit).
#map_2d = affine_map<(i, j) -> (i, j)>

func.func @gemm_glu(%A: tensor<256x512xf32>, %B: tensor<512x768xf32>) -> tensor<256x384xf32> {
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %empty_c = tensor.empty() : tensor<256x768xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty_c : tensor<256x768xf32>) -> tensor<256x768xf32>
  %C = linalg.matmul ins(%A, %B : tensor<256x512xf32>, tensor<512x768xf32>)
                     outs(%acc : tensor<256x768xf32>) -> tensor<256x768xf32>
  %value = tensor.extract_slice %C[0, 0] [256, 384] [1, 1]
      : tensor<256x768xf32> to tensor<256x384xf32>
  %gate = tensor.extract_slice %C[0, 384] [256, 384] [1, 1]
      : tensor<256x768xf32> to tensor<256x384xf32>
  %empty = tensor.empty() : tensor<256x384xf32>
  %out = linalg.generic {indexing_maps = [#map_2d, #map_2d, #map_2d],
                         iterator_types = ["parallel", "parallel"]}
      ins(%value, %gate : tensor<256x384xf32>, tensor<256x384xf32>)
      outs(%empty : tensor<256x384xf32>) {
  ^bb0(%v: f32, %g: f32, %unused: f32):
    // sigmoid(g) = 1 / (1 + exp(-g))
    %neg = arith.negf %g : f32
    %exp = math.exp %neg : f32
    %den = arith.addf %one, %exp : f32
    %sig = arith.divf %one, %den : f32
    %prod = arith.mulf %v, %sig : f32
    linalg.yield %prod : f32
  } -> tensor<256x384xf32>
  return %out : tensor<256x384xf32>
}
