// Voxel keys: member index in the most significant bits, then the Morton interleave of the three
// biased coordinates. Shared by every backend (host and device code).
//
// The documented voxel order reads each int32 coordinate as the unsigned c + 2^31 and interleaves all
// 32 bit levels (i before j before k). When every coordinate of a batch lies in [-2^(L-1), 2^(L-1)),
// the levels above L-1 only repeat the sign, so interleaving the L-bit numbers c + 2^(L-1) yields the
// same order with 3L bits instead of 96. KeyCodec records L (coord_bits) and the member bits; a key of
// member_bits + 3L <= 63 bits is a uint64_t, otherwise an unsigned __int128. Keys of one codec compare
// exactly like the documented order; keys of different codecs are never compared.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SG_HD __host__ __device__ __forceinline__
#else
#define SG_HD inline
#endif

namespace sparsegrid::detail {

__extension__ typedef unsigned __int128 Key128;

/// Spreads the low 21 bits of x so that bit b lands on bit 3b.
SG_HD uint64_t spread_bits3(uint64_t x) {
    x &= 0x1fffffull;
    x = (x | x << 32) & 0x1f00000000ffffull;
    x = (x | x << 16) & 0x1f0000ff0000ffull;
    x = (x | x << 8) & 0x100f00f00f00f00full;
    x = (x | x << 4) & 0x10c30c30c30c30c3ull;
    x = (x | x << 2) & 0x1249249249249249ull;
    return x;
}

/// Inverse of spread_bits3: gathers bits 0, 3, 6, ... into the low 21 bits.
SG_HD uint64_t compact_bits3(uint64_t x) {
    x &= 0x1249249249249249ull;
    x = (x ^ (x >> 2)) & 0x10c30c30c30c30c3ull;
    x = (x ^ (x >> 4)) & 0x100f00f00f00f00full;
    x = (x ^ (x >> 8)) & 0x1f0000ff0000ffull;
    x = (x ^ (x >> 16)) & 0x1f00000000ffffull;
    x = (x ^ (x >> 32)) & 0x1fffffull;
    return x;
}

struct KeyCodec {
    int32_t coord_bits = 1;   ///< L: coordinates lie in [-2^(L-1), 2^(L-1)), 1 <= L <= 32
    int32_t member_bits = 0;  ///< bits of the largest member index, 0..32

    SG_HD int32_t morton_bits() const { return 3 * coord_bits; }
    SG_HD int32_t total_bits() const { return member_bits + 3 * coord_bits; }
    /// 64-bit keys keep one bit free, so that all-ones can mark an unused slot on every backend.
    SG_HD bool fits_64() const { return total_bits() <= 63; }

    SG_HD uint64_t bias(int32_t c) const {
        return static_cast<uint64_t>(static_cast<int64_t>(c) + (int64_t{1} << (coord_bits - 1)));
    }
    SG_HD int32_t unbias(uint64_t u) const {
        return static_cast<int32_t>(static_cast<int64_t>(u) - (int64_t{1} << (coord_bits - 1)));
    }
};

/// Key of (member, i, j, k). Preconditions: the codec fits the key type and covers the coordinates.
template <typename KeyT>
SG_HD KeyT encode_key(const KeyCodec& codec, int64_t member, int32_t i, int32_t j, int32_t k);

template <>
SG_HD uint64_t encode_key<uint64_t>(const KeyCodec& codec, int64_t member, int32_t i, int32_t j, int32_t k) {
    const uint64_t morton = spread_bits3(codec.bias(i)) << 2 | spread_bits3(codec.bias(j)) << 1 |
        spread_bits3(codec.bias(k));
    return static_cast<uint64_t>(member) << codec.morton_bits() | morton;
}

template <>
SG_HD Key128 encode_key<Key128>(const KeyCodec& codec, int64_t member, int32_t i, int32_t j, int32_t k) {
    const uint64_t ui = codec.bias(i), uj = codec.bias(j), uk = codec.bias(k);
    const uint64_t low = spread_bits3(ui) << 2 | spread_bits3(uj) << 1 | spread_bits3(uk);
    const uint64_t high = spread_bits3(ui >> 21) << 2 | spread_bits3(uj >> 21) << 1 | spread_bits3(uk >> 21);
    return static_cast<Key128>(static_cast<uint64_t>(member)) << codec.morton_bits() | static_cast<Key128>(high) << 63 |
        static_cast<Key128>(low);
}

struct DecodedKey {
    int64_t member;
    int32_t ijk[3];
};

template <typename KeyT>
SG_HD DecodedKey decode_key(const KeyCodec& codec, KeyT key);

template <>
SG_HD DecodedKey decode_key<uint64_t>(const KeyCodec& codec, uint64_t key) {
    DecodedKey out;
    const int32_t shift = codec.morton_bits();
    out.member = shift >= 64 ? 0 : static_cast<int64_t>(key >> shift);
    const uint64_t morton = shift >= 64 ? key : key & ((uint64_t{1} << shift) - 1);
    out.ijk[0] = codec.unbias(compact_bits3(morton >> 2));
    out.ijk[1] = codec.unbias(compact_bits3(morton >> 1));
    out.ijk[2] = codec.unbias(compact_bits3(morton));
    return out;
}

template <>
SG_HD DecodedKey decode_key<Key128>(const KeyCodec& codec, Key128 key) {
    DecodedKey out;
    const int32_t shift = codec.morton_bits();
    out.member = static_cast<int64_t>(static_cast<uint64_t>(key >> shift));
    const Key128 morton = key & ((static_cast<Key128>(1) << shift) - 1);
    const uint64_t low = static_cast<uint64_t>(morton) & ((uint64_t{1} << 63) - 1);
    const uint64_t high = static_cast<uint64_t>(morton >> 63);
    for (int a = 0; a < 3; ++a) {
        const uint64_t u = compact_bits3(low >> (2 - a)) | compact_bits3(high >> (2 - a)) << 21;
        out.ijk[a] = codec.unbias(u);
    }
    return out;
}

/// Calls fn(KeyT{}) with the narrowest key type of the codec (host code: both branches are compiled).
template <typename Fn>
auto with_key_type(const KeyCodec& codec, Fn&& fn) {
    if (codec.fits_64()) return fn(uint64_t{});
    return fn(Key128{});
}

/// Slot of a 64-bit key in an open-addressing table of capacity mask + 1 (a power of two): the fmix64
/// finaliser of MurmurHash3 spreads Morton codes, whose low bits vary little, over the table.
SG_HD uint64_t hash_slot(uint64_t key, uint64_t mask) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    key *= 0xc4ceb9fe1a85ec53ull;
    key ^= key >> 33;
    return key & mask;
}

/// Capacity of a lookup table for `count` keys: a power of two, at most half full.
inline uint64_t hash_capacity(int64_t count) {
    uint64_t capacity = 1024;
    while (capacity < static_cast<uint64_t>(2 * count)) capacity *= 2;
    return capacity;
}

}  // namespace sparsegrid::detail
