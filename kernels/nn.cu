// NN layers on the GPU. Each layer's matrix product runs in cuBLAS (SGEMM, fp32, no TF32); this
// file holds what runs after it: bias and activation, and the final score of each document.

#define ACT_IDENTITY 0u
#define ACT_RELU 1u
#define ACT_TANH 2u
#define ACT_SIGMOID 3u

// y = activation(y + bias), in place, in f32 as `rank::cpu` computes it.
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
        const float v = __fadd_rn(y[t], bias[t % n_cols]);
        float out;
        switch (activation) {
        case ACT_RELU: out = v > 0.0f ? v : 0.0f; break;
        case ACT_TANH: out = tanhf(v); break;
        case ACT_SIGMOID: out = 1.0f / (1.0f + expf(-v)); break;
        default: out = v; break;
        }
        y[t] = out;
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
