// batch_norm_forward / batch_norm_backward (batch_norm.h) against a float64 oracle written from the
// definitions (two passes over the rows, no chunks), on every backend: each activation, with and without
// weight and bias, training and evaluation, momentum and the cumulative average, row counts around the
// chunk sizes; the oracle's gradients are checked against finite differences of its forward pass.
// Also the bitwise reproducibility and the errors.
#include "test_util.h"

#include <sparsegrid/batch_norm.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace sparsegrid_test {
namespace {

using sparsegrid::Activation;
using sparsegrid::BatchNormBackward;
using sparsegrid::BatchNormForward;
using sparsegrid::Buffer;
using sparsegrid::DType;

double act(Activation a, double z, double p) {
    switch (a) {
    case Activation::ReLU:
        return z > 0 ? z : 0;
    case Activation::LeakyReLU:
        return z > 0 ? z : p * z;
    case Activation::ELU:
        return z > 0 ? z : p * (std::exp(z) - 1);
    case Activation::SiLU:
        return z / (1 + std::exp(-z));
    case Activation::Identity:
        break;
    }
    return z;
}

struct Problem {
    int64_t rows = 0, channels = 0;
    std::vector<double> x, weight, bias, running_mean, running_var;
    bool has_affine = true, has_running = true, training = true, cumulative = false;
    int64_t batches = 3;  // num_batches_tracked before the call
    double momentum = 0.1, eps = 1e-5;
    Activation activation = Activation::Identity;
    double parameter = 0.0;
};

struct Result {
    std::vector<double> y, mean, invstd, running_mean, running_var;
    int64_t batches = 0;
};

/// The definitions, in float64, two passes per channel.
Result oracle_forward(const Problem& p) {
    Result r;
    const auto n = static_cast<double>(p.rows);
    r.y.resize(p.x.size());
    r.running_mean = p.running_mean;
    r.running_var = p.running_var;
    r.batches = p.batches + (p.training ? 1 : 0);
    for (int64_t c = 0; c < p.channels; ++c) {
        double mean = 0, var = 0;
        if (p.training) {
            for (int64_t i = 0; i < p.rows; ++i) mean += p.x[i * p.channels + c];
            mean = p.rows > 0 ? mean / n : 0;
            double squares = 0;
            for (int64_t i = 0; i < p.rows; ++i) squares += std::pow(p.x[i * p.channels + c] - mean, 2);
            var = p.rows > 0 ? squares / n : 0;
            if (p.has_running && p.rows > 0) {
                const double f = p.cumulative ? 1.0 / static_cast<double>(r.batches) : p.momentum;
                r.running_mean[c] = (1 - f) * p.running_mean[c] + f * mean;
                r.running_var[c] = (1 - f) * p.running_var[c] + f * squares / (n - 1);
            }
        } else {
            mean = p.running_mean[c];
            var = p.running_var[c];
        }
        const double invstd = 1 / std::sqrt(var + p.eps);
        r.mean.push_back(mean);
        r.invstd.push_back(invstd);
        const double w = p.has_affine ? p.weight[c] : 1, b = p.has_affine ? p.bias[c] : 0;
        for (int64_t i = 0; i < p.rows; ++i)
            r.y[i * p.channels + c] = act(p.activation, (p.x[i * p.channels + c] - mean) * invstd * w + b, p.parameter);
    }
    return r;
}

/// d(sum(dy * y)) / d(x, weight, bias) by central differences of the oracle (float64).
struct Gradients {
    std::vector<double> dx, dweight, dbias;
};

Gradients finite_differences(const Problem& p, const std::vector<double>& dy) {
    const auto loss = [&](const Problem& q) {
        const Result r = oracle_forward(q);
        double total = 0;
        for (size_t i = 0; i < dy.size(); ++i) total += dy[i] * r.y[i];
        return total;
    };
    const double h = 1e-6;
    const auto derivative = [&](std::vector<double> Problem::*member, size_t i) {
        Problem plus = p, minus = p;
        (plus.*member)[i] += h;
        (minus.*member)[i] -= h;
        return (loss(plus) - loss(minus)) / (2 * h);
    };
    Gradients g;
    for (size_t i = 0; i < p.x.size(); ++i) g.dx.push_back(derivative(&Problem::x, i));
    for (size_t c = 0; c < p.weight.size(); ++c) {
        g.dweight.push_back(derivative(&Problem::weight, c));
        g.dbias.push_back(derivative(&Problem::bias, c));
    }
    return g;
}

/// The closed form of the gradients, float64 (checked against finite_differences below).
Gradients oracle_backward(const Problem& p, const Result& f, const std::vector<double>& dy) {
    Gradients g;
    g.dx.resize(p.x.size());
    const auto n = static_cast<double>(p.rows);
    for (int64_t c = 0; c < p.channels; ++c) {
        const double w = p.has_affine ? p.weight[c] : 1, b = p.has_affine ? p.bias[c] : 0;
        double sum_g = 0, sum_gx = 0;
        std::vector<double> gs(p.rows), xhats(p.rows);
        for (int64_t i = 0; i < p.rows; ++i) {
            const double xhat = (p.x[i * p.channels + c] - f.mean[c]) * f.invstd[c];
            const double z = xhat * w + b;
            double d = 1;
            const double e = 1e-7;
            if (p.activation != Activation::Identity)
                d = (act(p.activation, z + e, p.parameter) - act(p.activation, z - e, p.parameter)) / (2 * e);
            gs[i] = dy[i * p.channels + c] * d;
            xhats[i] = xhat;
            sum_g += gs[i];
            sum_gx += gs[i] * xhat;
        }
        g.dweight.push_back(sum_gx);
        g.dbias.push_back(sum_g);
        for (int64_t i = 0; i < p.rows; ++i)
            g.dx[i * p.channels + c] = p.training ? w * f.invstd[c] * (gs[i] - sum_g / n - xhats[i] * sum_gx / n)
                                                  : w * f.invstd[c] * gs[i];
    }
    return g;
}

Problem random_problem(Rng& rng, int64_t rows, int64_t channels) {
    Problem p;
    p.rows = rows;
    p.channels = channels;
    std::normal_distribution<double> normal;
    // Channels with offsets far from zero and scales far from one, so that the centring matters.
    std::vector<double> offset(channels), scale(channels);
    for (int64_t c = 0; c < channels; ++c) {
        offset[c] = uniform_real(rng, -20, 20);
        scale[c] = uniform_real(rng, 0.1, 5);
    }
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t c = 0; c < channels; ++c) p.x.push_back(offset[c] + scale[c] * normal(rng));
    for (int64_t c = 0; c < channels; ++c) {
        p.weight.push_back(uniform_real(rng, -2, 2));
        p.bias.push_back(uniform_real(rng, -1, 1));
        p.running_mean.push_back(uniform_real(rng, -1, 1));
        p.running_var.push_back(uniform_real(rng, 0.5, 2));
    }
    return p;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& values) {
    return std::vector<T>(values.begin(), values.end());
}

/// Runs forward and backward of `p` in T on a backend; returns y, mean, invstd, running stats, batches
/// and the gradients, in float64.
template <typename T>
std::pair<Result, Gradients> run(const Problem& p, const std::vector<double>& dy, const sparsegrid::Context& ctx) {
    const auto up = [&](const std::vector<double>& v) { return Buffer<T>::from_host(cast<T>(v), ctx); };
    Buffer<T> x = up(p.x), weight = up(p.weight), bias = up(p.bias), running_mean = up(p.running_mean),
              running_var = up(p.running_var), grad = up(dy);
    Buffer<int64_t> batches = Buffer<int64_t>::from_host(std::vector<int64_t>{p.batches}, ctx);
    Buffer<T> y = Buffer<T>::allocate(p.rows * p.channels, ctx), mean = Buffer<T>::allocate(p.channels, ctx),
              invstd = Buffer<T>::allocate(p.channels, ctx);
    BatchNormForward f;
    f.input = x.data();
    f.output = y.data();
    f.rows = p.rows;
    f.channels = p.channels;
    f.dtype = std::is_same_v<T, double> ? DType::Float64 : DType::Float32;
    if (p.has_affine) {
        f.weight = weight.data();
        f.bias = bias.data();
    }
    if (p.has_running) {
        f.running_mean = running_mean.data();
        f.running_var = running_var.data();
        f.num_batches_tracked = batches.data();
    }
    f.training = p.training;
    f.momentum = p.momentum;
    f.cumulative_average = p.cumulative;
    f.eps = p.eps;
    f.activation = p.activation;
    f.activation_parameter = p.parameter;
    f.save_mean = mean.data();
    f.save_invstd = invstd.data();
    sparsegrid::batch_norm_forward(f, ctx);

    Buffer<T> dx = Buffer<T>::allocate(p.rows * p.channels, ctx), dweight = Buffer<T>::allocate(p.channels, ctx),
              dbias = Buffer<T>::allocate(p.channels, ctx);
    BatchNormBackward b;
    b.grad_output = grad.data();
    b.input = x.data();
    b.rows = p.rows;
    b.channels = p.channels;
    b.dtype = f.dtype;
    b.weight = f.weight;
    b.bias = f.bias;
    b.save_mean = mean.data();
    b.save_invstd = invstd.data();
    b.training = p.training;
    b.activation = p.activation;
    b.activation_parameter = p.parameter;
    b.grad_input = dx.data();
    b.grad_weight = dweight.data();
    b.grad_bias = dbias.data();
    sparsegrid::batch_norm_backward(b, ctx);

    const auto down = [](const Buffer<T>& buffer) {
        const std::vector<T> host = buffer.to_host();
        return std::vector<double>(host.begin(), host.end());
    };
    Result r{down(y), down(mean), down(invstd), down(running_mean), down(running_var), batches.to_host()[0]};
    return {r, Gradients{down(dx), down(dweight), down(dbias)}};
}

::testing::AssertionResult near(const std::vector<double>& got, const std::vector<double>& want, double tolerance,
                                const char* what) {
    if (got.size() != want.size())
        return ::testing::AssertionFailure() << what << ": " << got.size() << " values, expected " << want.size();
    double scale = 1;
    for (double v : want) scale = std::max(scale, std::abs(v));
    for (size_t i = 0; i < got.size(); ++i)
        if (!(std::abs(got[i] - want[i]) <= tolerance * scale))
            return ::testing::AssertionFailure() << what << "[" << i << "] = " << got[i] << ", expected " << want[i]
                                                 << " (tolerance " << tolerance * scale << ")";
    return ::testing::AssertionSuccess();
}

class BatchNormTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, BatchNormTest, ::testing::ValuesIn(available_backends()), backend_name);

TEST(BatchNormOracle, GradientsMatchFiniteDifferences) {
    Rng rng(7);
    for (Activation a :
         {Activation::Identity, Activation::ReLU, Activation::LeakyReLU, Activation::ELU, Activation::SiLU})
        for (bool training : {true, false}) {
            Problem p = random_problem(rng, 6, 2);
            p.activation = a;
            p.parameter = a == Activation::ELU ? 0.7 : 0.05;
            p.training = training;
            std::vector<double> dy;
            for (size_t i = 0; i < p.x.size(); ++i) dy.push_back(uniform_real(rng, -1, 1));
            const Gradients want = finite_differences(p, dy), got = oracle_backward(p, oracle_forward(p), dy);
            SCOPED_TRACE("activation " + std::to_string(static_cast<int>(a)) + (training ? " training" : " eval"));
            EXPECT_TRUE(near(got.dx, want.dx, 1e-5, "dx"));
            EXPECT_TRUE(near(got.dweight, want.dweight, 1e-5, "dweight"));
            EXPECT_TRUE(near(got.dbias, want.dbias, 1e-5, "dbias"));
        }
}

TEST_P(BatchNormTest, MatchesTheOracle) {
    Rng rng(11);
    int cases = 0;
    // Row counts: none, the fewest training takes, one chunk, its edge, several, and past 1024 chunks'
    // minimum size (chunks of 69 rows).
    for (int64_t rows : {0, 2, 7, 64, 65, 1000, 70001})
        for (int64_t channels : {1, 3, 33}) {
            if (rows * channels > 300000) continue;
            const auto a = static_cast<Activation>(cases % 5);
            Problem p = random_problem(rng, rows, channels);
            p.activation = a;
            p.parameter = a == Activation::ELU ? 1.3 : 0.01;
            p.training = cases % 4 != 3 || rows == 0;
            p.has_affine = cases % 3 != 1;
            p.has_running = cases % 6 != 4 || !p.training;
            p.cumulative = cases % 5 == 2;
            p.momentum = 0.25;
            ++cases;
            std::vector<double> dy;
            for (size_t i = 0; i < p.x.size(); ++i) dy.push_back(uniform_real(rng, -1, 1));
            const Result want = oracle_forward(p);
            Problem with_affine = p;  // the oracle's gradients of weight and bias exist either way
            if (!p.has_affine) {
                with_affine.weight.assign(channels, 1.0);
                with_affine.bias.assign(channels, 0.0);
                with_affine.has_affine = true;
            }
            const Gradients want_grad = oracle_backward(with_affine, oracle_forward(with_affine), dy);
            SCOPED_TRACE("rows " + std::to_string(rows) + ", channels " + std::to_string(channels) + ", activation " +
                         std::to_string(static_cast<int>(a)) + (p.training ? ", training" : ", eval") +
                         (p.has_affine ? "" : ", no affine") + (p.has_running ? "" : ", no running statistics") +
                         (p.cumulative ? ", cumulative" : ""));
            for (int precision = 0; precision < 2; ++precision) {
                const double tolerance = precision == 0 ? 1e-11 : 2e-4;
                const auto [got, grad] = precision == 0 ? run<double>(p, dy, ctx()) : run<float>(p, dy, ctx());
                SCOPED_TRACE(precision == 0 ? "float64" : "float32");
                EXPECT_TRUE(near(got.y, want.y, tolerance, "y"));
                EXPECT_TRUE(near(got.mean, want.mean, tolerance, "save_mean"));
                EXPECT_TRUE(near(got.invstd, want.invstd, tolerance, "save_invstd"));
                if (p.has_running) {
                    EXPECT_TRUE(near(got.running_mean, want.running_mean, tolerance, "running_mean"));
                    EXPECT_TRUE(near(got.running_var, want.running_var, tolerance, "running_var"));
                    EXPECT_EQ(got.batches, want.batches);
                }
                // The oracle's activation derivative is a central difference (1e-7): looser in float64.
                const double grad_tolerance = precision == 0 ? 1e-6 : 2e-3;
                EXPECT_TRUE(near(grad.dx, want_grad.dx, grad_tolerance, "grad_input"));
                EXPECT_TRUE(near(grad.dweight, want_grad.dweight, grad_tolerance, "grad_weight"));
                EXPECT_TRUE(near(grad.dbias, want_grad.dbias, grad_tolerance, "grad_bias"));
            }
        }
    EXPECT_GE(cases, 20);
}

TEST_P(BatchNormTest, IsBitwiseReproducible) {
    Rng rng(5);
    Problem p = random_problem(rng, 50000, 5);
    p.activation = Activation::SiLU;
    std::vector<double> dy;
    for (size_t i = 0; i < p.x.size(); ++i) dy.push_back(uniform_real(rng, -1, 1));
    const auto first = run<float>(p, dy, ctx()), second = run<float>(p, dy, ctx());
    EXPECT_EQ(first.first.y, second.first.y);
    EXPECT_EQ(first.first.running_var, second.first.running_var);
    EXPECT_EQ(first.second.dx, second.second.dx);
    EXPECT_EQ(first.second.dweight, second.second.dweight);
}

TEST_P(BatchNormTest, RejectsBadArguments) {
    Buffer<float> x = Buffer<float>::from_host(std::vector<float>{1, 2, 3, 4}, ctx());
    Buffer<float> y = Buffer<float>::allocate(4, ctx()), stats = Buffer<float>::allocate(4, ctx());
    const auto valid = [&] {
        BatchNormForward f;
        f.input = x.data();
        f.output = y.data();
        f.rows = 2;
        f.channels = 2;
        f.save_mean = stats.data();
        f.save_invstd = stats.data() + 2;
        return f;
    };
    const auto forward = [&](BatchNormForward f) { return [f, this] { sparsegrid::batch_norm_forward(f, ctx()); }; };
    BatchNormForward f = valid();
    f.rows = 1;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"more than 1 row"}));
    f = valid();
    f.training = false;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"running_mean"}));
    f = valid();
    f.running_mean = stats.data();
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"running_var"}));
    f = valid();
    f.eps = 0;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"eps"}));
    f = valid();
    f.channels = 0;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"channels"}));
    f = valid();
    f.rows = -1;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"rows"}));
    f = valid();
    f.rows = int64_t{1} << 62;
    f.channels = 8;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"overflows"}));
    f = valid();
    f.save_invstd = nullptr;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"save_invstd"}));
    f = valid();
    f.activation = static_cast<Activation>(9);
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"activation"}));
    f = valid();
    f.running_mean = stats.data();
    f.running_var = stats.data();
    f.cumulative_average = true;
    EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"num_batches_tracked"}));
    if (device().is_cpu()) {
        f = valid();
        f.dtype = DType::Float16;
        EXPECT_TRUE(throws_error(forward(f), "batch_norm_forward", {"CUDA only"}));
    }
    BatchNormBackward b;
    b.rows = 2;
    b.channels = 2;
    b.grad_input = y.data();
    b.input = x.data();
    b.grad_output = x.data();
    EXPECT_TRUE(throws_error([&] { sparsegrid::batch_norm_backward(b, ctx()); }, "batch_norm_backward", {"save_mean"}));
}

}  // namespace
}  // namespace sparsegrid_test
