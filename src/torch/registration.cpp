// The PyTorch layer's registration: TorchScript classes wrapping GridBatch and ConvolutionPlan and the
// free operators, registered with TORCH_LIBRARY so that they are usable from C++ (LibTorch) and Python
// (torch.classes.sparsegrid.*, torch.ops.sparsegrid.*). The layer is thin by design: check tensors,
// guard the device, take PyTorch's current stream, route memory through PyTorch's allocators, call
// the core (torch_runtime.h says how devices, streams and memory are handled).
//
// Files: torch_runtime.* (devices, streams, allocators, argument checks), grid_binding.* (GridBatch),
// plan_binding.* (ConvolutionPlan, sparse_conv), batch_norm_binding.* (batch norm), this file (the small
// free functions, registration).
#include "batch_norm_binding.h"
#include "grid_binding.h"
#include "plan_binding.h"
#include "torch_runtime.h"

#include <sparsegrid/context.h>
#include <sparsegrid/mesh_io.h>
#include <sparsegrid/shapes.h>

#include <torch/library.h>
#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace sparsegrid_torch {

namespace {

/// Surface voxels of `batch_size` procedural closed shapes at `resolution` (shapes.h): ijk [N, 3] int32
/// and member offsets [B+1] int64 on the CPU, member-major (each member in the generator's order).
std::tuple<torch::Tensor, torch::Tensor> synthetic_surface_batch(int64_t batch_size, int64_t resolution, int64_t seed) {
    if (resolution < 1 || resolution > INT32_MAX)
        fail("synthetic_surface_batch: resolution must be >= 1, got ", resolution);
    const auto members = sparsegrid::synthetic_surface_batch(batch_size, static_cast<int32_t>(resolution),
                                                             static_cast<uint64_t>(seed));
    std::vector<int64_t> offsets{0};
    for (const auto& member : members) offsets.push_back(offsets.back() + static_cast<int64_t>(member.size()));
    torch::Tensor ijk = torch::empty({offsets.back(), 3}, torch::dtype(torch::kInt32));
    int32_t* out = ijk.data_ptr<int32_t>();
    for (const auto& member : members)
        for (const Vec3i& v : member) {
            out[0] = v[0];
            out[1] = v[1];
            out[2] = v[2];
            out += 3;
        }
    return {ijk, torch::tensor(offsets, torch::dtype(torch::kInt64))};
}

/// A triangle mesh file (load_mesh): vertices [V, 3] float64 and faces [F, 3] int32, on the CPU.
std::tuple<torch::Tensor, torch::Tensor> load_mesh(std::string path) {
    const sparsegrid::TriangleMesh mesh = sparsegrid::load_mesh(path);
    torch::Tensor vertices = torch::empty({static_cast<int64_t>(mesh.vertices.size()), 3},
                                          torch::dtype(torch::kFloat64));
    torch::Tensor faces = torch::empty({static_cast<int64_t>(mesh.faces.size()), 3}, torch::dtype(torch::kInt32));
    for (size_t i = 0; i < mesh.vertices.size(); ++i)
        for (int a = 0; a < 3; ++a) vertices.data_ptr<double>()[3 * i + a] = mesh.vertices[i][a];
    for (size_t i = 0; i < mesh.faces.size(); ++i)
        for (int a = 0; a < 3; ++a) faces.data_ptr<int32_t>()[3 * i + a] = mesh.faces[i][a];
    return {vertices, faces};
}

}  // namespace

TORCH_LIBRARY(sparsegrid, m) {
    m.def("synthetic_surface_batch", &synthetic_surface_batch);
    m.def("load_mesh", &load_mesh);
    m.def("batch_norm", &batch_norm);
    m.def("batch_norm_forward", &batch_norm_forward);
    m.def("batch_norm_backward", &batch_norm_backward);

    m.class_<GridBatchHolder>("GridBatch")
        .def_static("from_ijk", &GridBatchHolder::from_ijk)
        .def_static("from_points", &GridBatchHolder::from_points)
        .def_static("from_mesh", &GridBatchHolder::from_mesh)
        .def("batch_size", &GridBatchHolder::batch_size)
        .def("num_voxels", &GridBatchHolder::num_voxels)
        .def("device", &GridBatchHolder::device)
        .def("to", &GridBatchHolder::to)
        .def("ijk", &GridBatchHolder::ijk)
        .def("offsets", &GridBatchHolder::offsets)
        .def("voxel_sizes", &GridBatchHolder::voxel_sizes)
        .def("origins", &GridBatchHolder::origins)
        .def("conv_grid", &GridBatchHolder::conv_grid)
        .def("conv_transpose_grid", &GridBatchHolder::conv_transpose_grid)
        .def("coarsened_grid", &GridBatchHolder::coarsened_grid)
        .def("pyramid", &GridBatchHolder::pyramid)
        .def("refined_grid", &GridBatchHolder::refined_grid)
        .def("dilated_grid", &GridBatchHolder::dilated_grid)
        .def("pruned_grid", &GridBatchHolder::pruned_grid)
        .def("pruned_grid_with_index", &GridBatchHolder::pruned_grid_with_index)
        .def("merged_grid", &GridBatchHolder::merged_grid)
        .def("clipped_grid", &GridBatchHolder::clipped_grid)
        .def("ijk_to_index", &GridBatchHolder::ijk_to_index)
        .def("bbox", &GridBatchHolder::bbox);
    m.class_<ConvolutionPlanHolder>("ConvolutionPlan")
        .def_static("make", &ConvolutionPlanHolder::make)
        .def("transposed", &ConvolutionPlanHolder::transposed)
        .def("source_grid", &ConvolutionPlanHolder::source_grid)
        .def("target_grid", &ConvolutionPlanHolder::target_grid)
        .def("is_identity", &ConvolutionPlanHolder::is_identity)
        .def("device", &ConvolutionPlanHolder::device)
        .def("target_map", &ConvolutionPlanHolder::target_map)
        .def("forward", &ConvolutionPlanHolder::forward)
        // sparse_conv as a method: the same autograd, without the operator's schema parsing per call.
        .def("execute",
             [](const ConvolutionPlanHolder::Ptr& self, torch::Tensor features, torch::Tensor weight) {
                 return sparse_conv(std::move(features), std::move(weight), self);
             })
        .def("backward_input", &ConvolutionPlanHolder::backward_input)
        .def("backward_weight", &ConvolutionPlanHolder::backward_weight, "",
             {torch::arg("input"), torch::arg("grad_output"), torch::arg("dtype") = c10::IValue()});
    // After the classes: the schema of sparse_conv names ConvolutionPlan.
    m.def("sparse_conv", &sparse_conv);
    m.def("convolution_seconds", [] { return convolution_seconds(); });
    m.def("host_synchronizations", [] { return sparsegrid::host_synchronizations(); });
    m.def("convolution_engine_configurations", [] { return sparsegrid::convolution_engine_configurations(); });
    m.def("set_convolution_engine_configuration",
          [](const std::string& name) { sparsegrid::set_convolution_engine_configuration(name); });
    m.def("set_convolution_engine_tuning",
          [](bool enabled, const std::string& file) { sparsegrid::set_convolution_engine_tuning(enabled, file); });
    m.def("cuda_backend_available", [] { return sparsegrid::cuda_backend_available(); });
    m.def("mesh_loading_available", [] { return sparsegrid::mesh_loading_available(); });
}

}  // namespace sparsegrid_torch
