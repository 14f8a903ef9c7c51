// Model-input transforms (MIT) on the GPU: the feature vector V of each document becomes the
// model inputs V' that the NN reads.
//
// Transform layout (must match `rank::plan::GpuTransform`, 32 bytes, little-endian):
//   unsigned kind     0 dummy (always 0), 1 linear, 2 log-linear, 3 bucket, 4 freeform,
//                     5 tree (written by trees_eval, skipped here)
//   unsigned feature  the feature read by linear, log-linear and bucket; for freeform, the offset
//                     of its program in `program`
//   float    slope    linear, log-linear
//   float    intercept linear, log-linear
//   double   lower    bucket: 1 when lower <= x < upper (f64)
//   double   upper
// Freeform programs are postfix: pairs (op, operand) of u32, see the FF_* codes below; operands
// are a feature index or the bits of an f32 constant; each program ends with FF_END and needs at
// most FF_STACK stack slots (rank::plan checks both).
//
// Transforms compute in f32 and read a missing value (NaN) as 0, except buckets, which compare
// the f64 value and contain no NaN; all as `rank::cpu` does.

struct Transform {
    unsigned kind;
    unsigned feature;
    float slope;
    float intercept;
    double lower;
    double upper;
};

#define KIND_DUMMY 0u
#define KIND_LINEAR 1u
#define KIND_LOGLINEAR 2u
#define KIND_BUCKET 3u
#define KIND_FREEFORM 4u
#define KIND_TREE 5u

#define FF_END 0u
#define FF_CONST 1u
#define FF_FEATURE 2u
#define FF_NEG 3u
#define FF_ADD 4u
#define FF_SUB 5u
#define FF_MUL 6u
#define FF_DIV 7u
#define FF_LN 8u
#define FF_EXP 9u
#define FF_MIN 10u
#define FF_MAX 11u
#define FF_STACK 16

__device__ __forceinline__ double read_feature(const double* f, unsigned i) {
    const double x = f[i];
    return isnan(x) ? 0.0 : x;
}

__device__ float eval_freeform(const unsigned* program, const double* f) {
    float stack[FF_STACK];
    int top = -1;
    for (unsigned pc = 0;; pc += 2) {
        const unsigned op = program[pc];
        const unsigned arg = program[pc + 1];
        switch (op) {
        case FF_END: return top >= 0 ? stack[top] : 0.0f;
        case FF_CONST: stack[++top] = __uint_as_float(arg); break;
        case FF_FEATURE: stack[++top] = (float)read_feature(f, arg); break;
        case FF_NEG: stack[top] = -stack[top]; break;
        case FF_LN: stack[top] = logf(stack[top]); break;
        case FF_EXP: stack[top] = expf(stack[top]); break;
        default: {
            const float b = stack[top--];
            const float a = stack[top];
            float r;
            switch (op) {
            case FF_ADD: r = __fadd_rn(a, b); break;
            case FF_SUB: r = __fsub_rn(a, b); break;
            case FF_MUL: r = __fmul_rn(a, b); break;
            case FF_DIV: r = __fdiv_rn(a, b); break;
            case FF_MIN: r = fminf(a, b); break;
            default: r = fmaxf(a, b); break;
            }
            stack[top] = r;
        }
        }
    }
}

// Computes every non-tree model input of every document.
//
// Launch shape: 1-D grid-stride over n_docs * n_columns threads, 256 per block; thread t computes
// column t % n_columns of document t / n_columns, so a warp is 32 neighbouring columns of one
// document. With warp-group reordering (rank::plan) those 32 columns share one transform kind and
// the warp does not diverge; dummy columns pad each kind's group to a multiple of 32.
//
// Reads:  transforms[n_columns], program, features[n_docs][n_features] (row-major f64).
// Writes: inputs[n_docs][n_columns] (row-major f32), every column but the tree columns.
extern "C" __global__ void mit_eval(
    const Transform* __restrict__ transforms,
    unsigned n_columns,
    const unsigned* __restrict__ program,
    const double* __restrict__ features,
    unsigned n_docs,
    unsigned n_features,
    float* __restrict__ inputs)
{
    const size_t total = (size_t)n_docs * n_columns;
    for (size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (size_t)gridDim.x * blockDim.x) {
        const unsigned col = (unsigned)(t % n_columns);
        const size_t doc = t / n_columns;
        const Transform tr = transforms[col];
        const double* f = features + doc * n_features;
        float v;
        switch (tr.kind) {
        case KIND_LINEAR:
            v = __fadd_rn(__fmul_rn((float)read_feature(f, tr.feature), tr.slope), tr.intercept);
            break;
        case KIND_LOGLINEAR:
            v = __fadd_rn(__fmul_rn(logf(__fadd_rn((float)read_feature(f, tr.feature), 1.0f)), tr.slope),
                          tr.intercept);
            break;
        case KIND_BUCKET: {
            const double x = f[tr.feature];  // a missing value (NaN) is in no bucket
            v = (tr.lower <= x && x < tr.upper) ? 1.0f : 0.0f;
            break;
        }
        case KIND_FREEFORM: v = eval_freeform(program + tr.feature, f); break;
        case KIND_TREE: continue;
        default: v = 0.0f; break;
        }
        inputs[t] = v;
    }
}
