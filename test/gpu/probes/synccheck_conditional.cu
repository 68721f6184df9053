//===- synccheck_conditional.cu - Does synccheck follow kernels in if-node bodies? -------===//
//
// A probe for docs/reliability.md (fifth round), not part of the runtime. Two kernels whose
// every thread reaches every __syncthreads() of its block:
//   - rowSums: each thread loads one value into shared memory, one barrier, a row sum;
//   - gatedTiles: the shape of GaLore's gemmKernel (runtime/cuda/GaLore.cu): an early return
//     on a gate word the whole grid reads alike, then a loop over K with two barriers per
//     tile, most threads' loads out of range on a small problem (as in the kernel-table
//     sample: 32 x 8 outputs from 64 x 64 tiles).
// Each runs four ways on the same inputs and the host checks every output:
//   1. launched on a stream;
//   2. in a graph built through the API: a kernel sets the condition, an if-node holds it;
//   3. as the runtime captures a GaLore refresh (captureIfDue): the outer graph by stream
//      capture, the begin kernel and the if-node added to it during the capture, the body
//      captured on a second stream with cudaStreamBeginCaptureToGraph; replayed 3 times;
//   4. the same capture with the body on the outer stream's graph directly (no if-node).
// Run under
//   compute-sanitizer --tool synccheck --print-limit 5 synccheck-conditional
// The program prints a line before each launch, so the tool's reports land after the launch
// that caused them: reports after 2 or 3 and none after 1 and 4 show that the tool's
// "Divergent thread(s) in warp" reports follow the if-node body, not the kernel.
//
//===----------------------------------------------------------------------===//

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    if (cudaError_t error_ = (call); error_ != cudaSuccess) {                                    \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(error_));                \
      return 1;                                                                                  \
    }                                                                                            \
  } while (0)

constexpr int kThreads = 256, kRow = 16, kTile = 64, kDepth = 16;

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

/// C[M, N] = A[M, K] B[K, N], f32, as GaLore's gemmKernel<float, false> computes it.
__global__ void __launch_bounds__(kThreads)
    gatedTiles(const float *a, const float *b, float *c, int M, int N, int K, const int *go) {
  if (!*go)
    return;
  __shared__ float as[kDepth][kTile + 1];
  __shared__ float bs[kDepth][kTile + 1];
  int row0 = blockIdx.y * kTile, col0 = blockIdx.x * kTile;
  int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += kDepth) {
    for (int e = threadIdx.x; e < kDepth * kTile; e += kThreads) {
      int ii = e / kDepth, kk = e % kDepth;
      int i = row0 + ii, k = k0 + kk;
      as[kk][ii] = (i < M && k < K) ? a[i * K + k] : 0.0f;
      int jj = e % kTile, kb = e / kTile;
      int j = col0 + jj, kr = k0 + kb;
      bs[kb][jj] = (j < N && kr < K) ? b[kr * N + j] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kDepth; ++kk)
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int y = 0; y < 4; ++y)
          acc[x][y] += as[kk][tr + 16 * x] * bs[kk][tc + 16 * y];
    __syncthreads();
  }
  for (int x = 0; x < 4; ++x)
    for (int y = 0; y < 4; ++y) {
      int i = row0 + tr + 16 * x, j = col0 + tc + 16 * y;
      if (i < M && j < N)
        c[i * N + j] = acc[x][y];
    }
}

__global__ void setCondition(cudaGraphConditionalHandle handle, int *go) {
  cudaGraphSetConditional(handle, 1);
  *go = 1;
}

__global__ void openGate(int *go) { *go = 1; }

namespace {

constexpr int kBlocks = 64, kIn = kBlocks * kThreads, kSums = kBlocks * (kThreads / kRow);
constexpr int kM = 32, kN = 8, kK = 40;

/// The device buffers and the launches of both kernels on one stream.
struct Work {
  float *in, *sums, *a, *b, *c;
  int *go;
  void launch(cudaStream_t stream) const {
    rowSums<<<kBlocks, kThreads, 0, stream>>>(in, sums);
    dim3 grid((kN + kTile - 1) / kTile, (kM + kTile - 1) / kTile);
    gatedTiles<<<grid, kThreads, 0, stream>>>(a, b, c, kM, kN, kK, go);
  }
};

/// Checks both kernels' outputs against the host and clears them for the next way.
int check(const char *way, const Work &w, const std::vector<float> &in,
          const std::vector<float> &a, const std::vector<float> &b) {
  std::vector<float> sums(kSums), c(kM * kN);
  CHECK(cudaMemcpy(sums.data(), w.sums, sums.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(c.data(), w.c, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < kSums; ++r) {
    float want = 0.0f;
    for (int i = 0; i < kRow; ++i)
      want += in[r * kRow + i];
    wrong += sums[r] != want;
  }
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      float want = 0.0f;
      for (int k = 0; k < kK; ++k)
        want += a[i * kK + k] * b[k * kN + j];
      wrong += std::abs(c[i * kN + j] - want) > 1e-4f * (1.0f + std::abs(want));
    }
  std::printf("%s: %d of %d outputs differ from the host's\n", way, wrong, kSums + kM * kN);
  CHECK(cudaMemset(w.sums, 0, kSums * sizeof(float)));
  CHECK(cudaMemset(w.c, 0, kM * kN * sizeof(float)));
  return wrong != 0;
}

} // namespace

int main() {
  std::vector<float> in(kIn), a(kM * kK), b(kK * kN);
  for (int i = 0; i < kIn; ++i)
    in[i] = float(i % 7);
  for (int i = 0; i < kM * kK; ++i)
    a[i] = float(i % 5) - 2.0f;
  for (int i = 0; i < kK * kN; ++i)
    b[i] = float(i % 3) * 0.5f;
  Work w;
  CHECK(cudaMalloc(&w.in, kIn * sizeof(float)));
  CHECK(cudaMalloc(&w.sums, kSums * sizeof(float)));
  CHECK(cudaMalloc(&w.a, a.size() * sizeof(float)));
  CHECK(cudaMalloc(&w.b, b.size() * sizeof(float)));
  CHECK(cudaMalloc(&w.c, kM * kN * sizeof(float)));
  CHECK(cudaMalloc(&w.go, sizeof(int)));
  CHECK(cudaMemcpy(w.in, in.data(), kIn * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w.a, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(w.b, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice));
  int one = 1;
  CHECK(cudaMemcpy(w.go, &one, sizeof(int), cudaMemcpyHostToDevice));
  CHECK(cudaMemset(w.sums, 0, kSums * sizeof(float)));
  CHECK(cudaMemset(w.c, 0, kM * kN * sizeof(float)));
  cudaStream_t stream, side;
  CHECK(cudaStreamCreate(&stream));
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  int failed = 0;

  std::printf("== 1. launched on a stream\n");
  std::fflush(stdout);
  w.launch(stream);
  CHECK(cudaStreamSynchronize(stream));
  failed |= check("1. stream", w, in, a, b);

  // 2. setCondition -> if (condition) { rowSums; gatedTiles }, built through the API.
  {
    cudaGraph_t graph;
    CHECK(cudaGraphCreate(&graph, 0));
    cudaGraphConditionalHandle handle;
    CHECK(cudaGraphConditionalHandleCreate(&handle, graph, 0, 0));
    cudaKernelNodeParams set = {};
    void *setArgs[] = {&handle, &w.go};
    set.func = reinterpret_cast<void *>(setCondition);
    set.gridDim = dim3(1);
    set.blockDim = dim3(1);
    set.kernelParams = setArgs;
    cudaGraphNode_t setNode, ifNode, sumsNode, tilesNode;
    CHECK(cudaGraphAddKernelNode(&setNode, graph, nullptr, 0, &set));
    cudaGraphNodeParams params = {};
    params.type = cudaGraphNodeTypeConditional;
    params.conditional.handle = handle;
    params.conditional.type = cudaGraphCondTypeIf;
    params.conditional.size = 1;
    CHECK(cudaGraphAddNode(&ifNode, graph, &setNode, nullptr, 1, &params));
    cudaGraph_t body = params.conditional.phGraph_out[0];
    cudaKernelNodeParams sums = {};
    void *sumsArgs[] = {&w.in, &w.sums};
    sums.func = reinterpret_cast<void *>(rowSums);
    sums.gridDim = dim3(kBlocks);
    sums.blockDim = dim3(kThreads);
    sums.kernelParams = sumsArgs;
    CHECK(cudaGraphAddKernelNode(&sumsNode, body, nullptr, 0, &sums));
    int m = kM, n = kN, k = kK;
    cudaKernelNodeParams tiles = {};
    void *tilesArgs[] = {&w.a, &w.b, &w.c, &m, &n, &k, &w.go};
    tiles.func = reinterpret_cast<void *>(gatedTiles);
    tiles.gridDim = dim3((kN + kTile - 1) / kTile, (kM + kTile - 1) / kTile);
    tiles.blockDim = dim3(kThreads);
    tiles.kernelParams = tilesArgs;
    CHECK(cudaGraphAddKernelNode(&tilesNode, body, &sumsNode, 1, &tiles));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    std::printf("== 2. if-node body built through the API\n");
    std::fflush(stdout);
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    failed |= check("2. API if-node", w, in, a, b);
  }

  // 3 and 4: stream capture as runtime/cuda/GaLore.cu's captureIfDue does it.
  for (bool conditional : {true, false}) {
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaStreamCaptureStatus capture;
    cudaGraph_t capturing = nullptr;
    CHECK(cudaStreamGetCaptureInfo(stream, &capture, nullptr, &capturing, nullptr, nullptr,
                                   nullptr));
    if (conditional) {
      // A handle the graph does not use fails its instantiation: way 4 makes none.
      cudaGraphConditionalHandle handle;
      CHECK(cudaGraphConditionalHandleCreate(&handle, capturing, 0, 0));
      setCondition<<<1, 1, 0, stream>>>(handle, w.go);
      const cudaGraphNode_t *dependencies = nullptr;
      size_t count = 0;
      CHECK(cudaStreamGetCaptureInfo(stream, &capture, nullptr, &capturing, &dependencies,
                                     nullptr, &count));
      cudaGraphNodeParams params = {};
      params.type = cudaGraphNodeTypeConditional;
      params.conditional.handle = handle;
      params.conditional.type = cudaGraphCondTypeIf;
      params.conditional.size = 1;
      cudaGraphNode_t node;
      CHECK(cudaGraphAddNode(&node, capturing, dependencies, nullptr, count, &params));
      CHECK(cudaStreamUpdateCaptureDependencies(stream, &node, nullptr, 1,
                                                cudaStreamSetCaptureDependencies));
      CHECK(cudaStreamBeginCaptureToGraph(side, params.conditional.phGraph_out[0], nullptr,
                                          nullptr, 0, cudaStreamCaptureModeThreadLocal));
      w.launch(side);
      cudaGraph_t ended = nullptr;
      CHECK(cudaStreamEndCapture(side, &ended));
    } else {
      openGate<<<1, 1, 0, stream>>>(w.go);
      w.launch(stream);
    }
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    const char *way = conditional ? "3. captured if-node body" : "4. captured, no if-node";
    for (int replay = 0; replay < 3; ++replay) {
      std::printf("== %s, replay %d\n", way, replay);
      std::fflush(stdout);
      CHECK(cudaGraphLaunch(exec, stream));
      CHECK(cudaStreamSynchronize(stream));
      failed |= check(way, w, in, a, b);
    }
  }
  std::printf("%s\n", failed ? "probe: some outputs are wrong" : "probe: every output is right");
  return failed;
}
