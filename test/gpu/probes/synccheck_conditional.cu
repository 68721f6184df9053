//===- synccheck_conditional.cu - Does synccheck follow kernels in if-node bodies? -------===//
//
// A probe for docs/reliability.md (fifth round), not part of the runtime. One kernel whose
// every thread loads a tile into shared memory, meets one __syncthreads() and sums its row of
// the tile: a barrier all threads of the block reach. It runs twice on the same inputs, once
// launched on a stream and once inside the body of a CUDA Graph if-node (a conditional node,
// set by a kernel before it) as the runtime's guarded update and GaLore's refresh capture
// theirs; the host checks both outputs. Run under
//   compute-sanitizer --tool synccheck synccheck-conditional
// a report in the graph's launch and none in the plain one would show that the tool's
// "Divergent thread(s) in warp" reports there follow the if-node body, not the kernel.
//
//===----------------------------------------------------------------------===//

#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    if (cudaError_t status = (call); status != cudaSuccess) {                                    \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(status));                \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

constexpr int kThreads = 256, kRow = 16;

__global__ void rowSums(const float *in, float *out) {
  __shared__ float tile[kThreads];
  tile[threadIdx.x] = in[blockIdx.x * kThreads + threadIdx.x];
  __syncthreads();
  if (threadIdx.x < kThreads / kRow) {
    float sum = 0.0f;
    for (int i = 0; i < kRow; ++i)
      sum += tile[threadIdx.x * kRow + i];
    out[blockIdx.x * (kThreads / kRow) + threadIdx.x] = sum;
  }
}

__global__ void setCondition(cudaGraphConditionalHandle handle) {
  cudaGraphSetConditional(handle, 1);
}

int main() {
  const int blocks = 64, n = blocks * kThreads, m = blocks * (kThreads / kRow);
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i)
    host[i] = float(i % 7);
  float *in = nullptr, *plain = nullptr, *conditional = nullptr;
  CHECK(cudaMalloc(&in, n * sizeof(float)));
  CHECK(cudaMalloc(&plain, m * sizeof(float)));
  CHECK(cudaMalloc(&conditional, m * sizeof(float)));
  CHECK(cudaMemcpy(in, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));

  std::printf("plain launch\n");
  rowSums<<<blocks, kThreads, 0, stream>>>(in, plain);
  CHECK(cudaStreamSynchronize(stream));

  // The graph: setCondition -> if (condition) { rowSums }.
  cudaGraph_t graph;
  CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphConditionalHandle handle;
  CHECK(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0));
  cudaKernelNodeParams set = {};
  void *setArgs[] = {&handle};
  set.func = reinterpret_cast<void *>(setCondition);
  set.gridDim = dim3(1);
  set.blockDim = dim3(1);
  set.kernelParams = setArgs;
  cudaGraphNode_t setNode, ifNode, bodyNode;
  CHECK(cudaGraphAddKernelNode(&setNode, graph, nullptr, 0, &set));
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeIf;
  params.conditional.size = 1;
  CHECK(cudaGraphAddNode(&ifNode, graph, &setNode, nullptr, 1, &params));
  cudaKernelNodeParams body = {};
  void *bodyArgs[] = {&in, &conditional};
  body.func = reinterpret_cast<void *>(rowSums);
  body.gridDim = dim3(blocks);
  body.blockDim = dim3(kThreads);
  body.kernelParams = bodyArgs;
  CHECK(cudaGraphAddKernelNode(&bodyNode, params.conditional.phGraph_out[0], nullptr, 0, &body));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::printf("if-node body launch\n");
  CHECK(cudaGraphLaunch(exec, stream));
  CHECK(cudaStreamSynchronize(stream));

  std::vector<float> a(m), b(m);
  CHECK(cudaMemcpy(a.data(), plain, m * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(b.data(), conditional, m * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < m; ++r) {
    float want = 0.0f;
    for (int i = 0; i < kRow; ++i)
      want += host[r * kRow + i];
    wrong += a[r] != want || b[r] != want;
  }
  std::printf("%d of %d row sums differ from the host's\n", wrong, m);
  return wrong != 0;
}
