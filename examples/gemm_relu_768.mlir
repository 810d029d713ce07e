// out[768,384] = relu(A[768,640] @ B[640,384]): the GPU tuning spaces' mid-size GEMM (not in manifest.yaml;
// tests/test_gpu_spaces.py and bench/gpu_spaces.py build it).
#map_2d = affine_map<(i, j) -> (i, j)>

func.func @gemm_relu_768(%A: tensor<768x640xf32>, %B: tensor<640x384xf32>) -> tensor<768x384xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<768x384xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<768x384xf32>) -> tensor<768x384xf32>
  %C = linalg.matmul ins(%A, %B : tensor<768x640xf32>, tensor<640x384xf32>)
                     outs(%acc : tensor<768x384xf32>) -> tensor<768x384xf32>
  %out = linalg.generic {indexing_maps = [#map_2d, #map_2d], iterator_types = ["parallel", "parallel"]}
      ins(%C : tensor<768x384xf32>) outs(%empty : tensor<768x384xf32>) {
  ^bb0(%c: f32, %unused: f32):
    %relu = arith.maximumf %c, %zero : f32
    linalg.yield %relu : f32
  } -> tensor<768x384xf32>
  return %out : tensor<768x384xf32>
}
