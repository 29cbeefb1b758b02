// Umbrella header of the sparsegrid core.
#pragma once

#include <sparsegrid/batch_norm.h>
#include <sparsegrid/buffer.h>
#include <sparsegrid/context.h>
#include <sparsegrid/convolution.h>
#include <sparsegrid/grid_batch.h>
#include <sparsegrid/io.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/mesh_io.h>
#include <sparsegrid/shapes.h>
#include <sparsegrid/types.h>
#include <sparsegrid/version.h>
