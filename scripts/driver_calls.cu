// What one CUDA driver call costs on this host: host time per call of an empty kernel launch, a
// 16 KiB pinned host-to-device async copy, an event record, a stream wait on an event, a
// synchronize of an idle stream, and a launch + synchronize round trip (docs/benchmarks.md,
// "Several GPUs in one process"). On the GPU machine:
//
//     nvcc -O2 -o /tmp/driver_calls scripts/driver_calls.cu && /tmp/driver_calls
#include <cstdio>
#include <chrono>
#include <cuda_runtime.h>
__global__ void empty_kernel(int *p) { if (p && threadIdx.x == 1024) *p = 1; }
template <class F> double per_call(F f, int n) {
  for (int i = 0; i < 1000; i++) f();
  cudaDeviceSynchronize();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; i++) f();
  auto t1 = std::chrono::steady_clock::now();
  cudaDeviceSynchronize();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / n;
}
int main() {
  cudaStream_t s, s2; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  char *h, *d; cudaMallocHost(&h, 1 << 14); cudaMalloc(&d, 1 << 14);
  cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  int n = 20000;
  printf("launch (empty kernel)  %.2f us/call\n", per_call([&] { empty_kernel<<<32, 256, 0, s>>>(nullptr); }, n));
  printf("memcpy H2D 16 KiB async %.2f us/call\n", per_call([&] { cudaMemcpyAsync(d, h, 1 << 14, cudaMemcpyHostToDevice, s); }, n));
  printf("event record            %.2f us/call\n", per_call([&] { cudaEventRecord(e, s); }, n));
  printf("stream wait event       %.2f us/call\n", per_call([&] { cudaStreamWaitEvent(s2, e, 0); }, n));
  printf("sync idle stream        %.2f us/call\n", per_call([&] { cudaStreamSynchronize(s); }, n));
  printf("launch + sync (round trip) %.2f us/call\n", per_call([&] { empty_kernel<<<1, 32, 0, s>>>(nullptr); cudaStreamSynchronize(s); }, 5000));
  return 0;
}
