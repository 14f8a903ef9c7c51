// NN layers on the GPU. Each layer's matrix product runs in cuBLAS (SGEMM, fp32, no TF32); this
// file holds what runs after it: bias and activation, and the final score of each document; and
// a last layer of one output whole (its dot products, bias, activation and the score in one
// launch, where cuBLAS, the bias and the scores would take three).

#define ACT_IDENTITY 0u
#define ACT_RELU 1u
#define ACT_TANH 2u
#define ACT_SIGMOID 3u

// activation(v) in f32 as `rank::cpu` computes it (tanh and exp are evaluated in f64 and rounded
// once, to agree with the CPU's correctly rounded f32 functions).
__device__ __forceinline__ float nn_activate(float v, unsigned activation) {
    switch (activation) {
    case ACT_RELU: return v > 0.0f ? v : 0.0f;
    case ACT_TANH: return (float)tanh((double)v);
    case ACT_SIGMOID: return __fdiv_rn(1.0f, __fadd_rn(1.0f, (float)exp((double)-v)));
    default: return v;
    }
}

// y = activation(y + bias), in place, in f32 as `rank::cpu` computes it (tanh and exp are
// evaluated in f64 and rounded once, to agree with the CPU's correctly rounded f32 functions).
//
// Launch shape: 1-D grid-stride over n_rows * n_cols threads, 256 per block; thread t owns
// element t of the row-major matrix y[n_rows][n_cols] (rows are documents, columns outputs).
// Reads/writes: y. Reads: bias[n_cols].
extern "C" __global__ void nn_bias_activation(
    float* __restrict__ y,
    const float* __restrict__ bias,
    unsigned n_rows,
    unsigned n_cols,
    unsigned activation)
{
    const size_t total = (size_t)n_rows * n_cols;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x) {
        y[t] = nn_activate(__fadd_rn(y[t], bias[t % n_cols]), activation);
    }
}

// The score of each document: the ranker's value plus f64 tree sums.
//
// Launch shape: 1-D grid-stride over n_docs threads, 256 per block; thread d owns document d.
// Reads:  values[n_docs][stride] (f32), of which the first n_summed columns of each row are
//         summed in f64: with layers, the last layer's output (stride 1, n_summed 1); without,
//         the transform columns of the model-input matrix (dummy columns hold 0);
//         tree_inputs[n_docs] (f64: the sum of the tree inputs' leaves, for rankers without
//         layers) and ensemble[n_docs] (f64, base score included), each NULL when absent.
// Writes: scores[n_docs] (f64).
extern "C" __global__ void nn_scores(
    const float* __restrict__ values,
    unsigned stride,
    unsigned n_summed,
    const double* __restrict__ tree_inputs,
    const double* __restrict__ ensemble,
    unsigned n_docs,
    double* __restrict__ scores)
{
    for (unsigned d = blockIdx.x * blockDim.x + threadIdx.x; d < n_docs; d += gridDim.x * blockDim.x) {
        double value = 0.0;
        const float* row = values + (size_t)d * stride;
        for (unsigned c = 0; c < n_summed; ++c) value += (double)row[c];
        if (tree_inputs) value += tree_inputs[d];
        scores[d] = ensemble ? value + ensemble[d] : value;
    }
}

// The score of each document from a last layer of one output: y = activation(x · w + bias),
// then y plus the f64 tree sums as `nn_scores` adds them. The dot product is summed in f32 over
// the warp (lane-strided partial sums, then a butterfly), not in cuBLAS's order: scores agree
// with the CPU's within the NN tolerance, as cuBLAS's do.
//
// Launch shape: 1-D grid-stride over n_docs warps, 256 threads per block (8 documents a block);
// warp w owns document w, its lanes reading the row's inputs 32 apart (coalesced).
// Reads:  x[n_docs][n_inputs] (f32, the layer's input), w[n_inputs], bias[1] (f32);
//         tree_inputs[n_docs] and ensemble[n_docs] (f64), each NULL when absent.
// Writes: scores[n_docs] (f64).
extern "C" __global__ void nn_single_output_scores(
    const float* __restrict__ x,
    unsigned n_inputs,
    const float* __restrict__ w,
    const float* __restrict__ bias,
    unsigned activation,
    const double* __restrict__ tree_inputs,
    const double* __restrict__ ensemble,
    unsigned n_docs,
    double* __restrict__ scores)
{
    const unsigned lane = threadIdx.x % 32;
    const unsigned warps = gridDim.x * blockDim.x / 32;
    // d is the same on every lane of a warp, so the whole warp loops and shuffles together.
    for (unsigned d = (blockIdx.x * blockDim.x + threadIdx.x) / 32; d < n_docs; d += warps) {
        const float* row = x + (size_t)d * n_inputs;
        float sum = 0.0f;
        for (unsigned i = lane; i < n_inputs; i += 32) sum = fmaf(row[i], w[i], sum);
        for (int offset = 16; offset > 0; offset /= 2) {
            sum += __shfl_xor_sync(0xffffffffu, sum, offset);
        }
        if (lane == 0) {
            double value = (double)nn_activate(__fadd_rn(sum, bias[0]), activation);
            if (tree_inputs) value += tree_inputs[d];
            scores[d] = ensemble ? value + ensemble[d] : value;
        }
    }
}
