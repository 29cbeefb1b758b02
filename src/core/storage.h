// What a GridBatch holds. Backends produce a GridTopology; the front end adds transforms and context.
#pragma once

#include <sparsegrid/buffer.h>
#include <sparsegrid/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace sparsegrid::detail {

struct GridTopology {
    std::vector<int64_t> offsets;    ///< host copy, B+1
    Buffer<int64_t> offsets_buffer;  ///< on the device
    Buffer<int32_t> ijk;             ///< N x 3, voxel order
    CoordBox box;                    ///< contains every voxel
};

struct GridStorage;
struct PlanMaps;  // convolution.cpp

/// A convolution plan kept on its source grid (GridCache::plans): its kernel size, stride, direction and
/// target -- generated from the source (`generated`), the source itself, or a given grid (`target`,
/// held weakly: an entry whose target is gone is dropped) -- and its maps.
struct CachedPlan {
    enum class Target { Generated, Source, Given };
    Vec3i kernel_size{};
    Vec3i stride{};
    int direction = 0;
    Target kind = Target::Generated;
    std::weak_ptr<const GridStorage> target;
    std::shared_ptr<const GridStorage> generated;
    std::shared_ptr<PlanMaps> maps;
};

/// What the library derives from a grid and keeps with it once built, freed with the grid: the lookup
/// structure of its kernel maps (a hash table or sorted keys), which every map and plan whose source is
/// the grid reuses, and the plans whose source it is. Each is built on first use, under its mutex.
struct GridCache {
    std::mutex mutex;
    const void* lookup_type = nullptr;  ///< identifies the type behind `lookup` (one static per type)
    std::shared_ptr<const void> lookup;
    std::mutex plan_mutex;
    std::vector<CachedPlan> plans;
};

/// Lookups built so far in this process (every GridCache fill): lets tests check that a grid builds
/// its lookup once.
int64_t lookup_builds();
void count_lookup_build();

struct GridStorage : std::enable_shared_from_this<GridStorage> {
    GridTopology topology;
    std::vector<MemberTransform> transforms;
    Context context;
    mutable GridCache cache;

    int64_t batch_size() const { return static_cast<int64_t>(topology.offsets.size()) - 1; }
    int64_t num_voxels() const { return topology.offsets.back(); }
};

/// The grid's cached lookup of type T, built by `make()` (returning a T) on first use.
template <typename T, typename Make>
std::shared_ptr<const T> cached_lookup(const GridStorage& grid, Make&& make) {
    static const char tag = 0;
    std::lock_guard<std::mutex> lock(grid.cache.mutex);
    if (!grid.cache.lookup || grid.cache.lookup_type != &tag) {
        grid.cache.lookup = std::make_shared<const T>(make());
        grid.cache.lookup_type = &tag;
        count_lookup_build();
    }
    return std::static_pointer_cast<const T>(grid.cache.lookup);
}

}  // namespace sparsegrid::detail
