// y[M, N] = x[M, K] @ W[K, N] in float32 for a few rows (M = 1..32), on
// weights repacked once into column blocks [ceil(N / NB), K, NB] (the last
// block padded with zeros).
//
// Why: XLA:CPU's dot for 2-8 rows packs the weights on every call and streams
// them at 14-21 GB/s where a one-row GEMV reaches ~25 GB/s, so a target block
// of gamma + 1 tokens costs 1.5-1.75 one-token steps. Here each column block
// is one contiguous run of K * NB floats, read from DRAM once, with the
// accumulators of up to MR rows x NB columns in registers. A core walks
// several blocks in turns of a few k-steps (more DRAM streams in flight than
// one block gives); more rows are done in tiles of MR over each turn's
// weights, by then in L1, so DRAM traffic stays one pass over W whatever M is.
// The row tiles prefetch a later turn's weights (on Intel each tile a share
// of it, on AMD the later tiles, which read only L1), so DRAM keeps
// streaming while they compute.
//
// Every output element is one fused multiply-add chain over k = 0..K-1 in
// order, starting from zero, whatever M, the row tile or the thread split: a
// row's result is bitwise the same in a one-row step as in a block (greedy
// speculative decoding then matches the greedy baseline token for token).
//
// Built by speculative_t5x/kernels/cpu_matmul.py with -march=native: AVX-512
// (NB = 32, MR = 12 of 32 zmm registers) where the compiler defines
// __AVX512F__, else AVX2 + FMA (NB = 16, MR = 6 of 16 ymm registers).
// Column blocks are split over XLA's intra-op pool, whose threads exist anyway
// (a pool of the library's own added spinning threads that competed with them
// on 2 cores: kernels/DESIGN.md).

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
constexpr int kMaxRows = 12;  // 12 rows x 2 vectors = 24 accumulators of 32.
inline Vec Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec Zero() { return _mm512_setzero_ps(); }
inline Vec Broadcast(float x) { return _mm512_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline void KeepInRegister(Vec& v) { asm("" : "+v"(v)); }
constexpr int kRegisters = 32;
#elif defined(__AVX2__) && defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
constexpr int kMaxRows = 6;  // 6 rows x 2 vectors = 12 accumulators of 16.
inline Vec Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec Zero() { return _mm256_setzero_ps(); }
inline Vec Broadcast(float x) { return _mm256_set1_ps(x); }
inline Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline void KeepInRegister(Vec& v) { asm("" : "+x"(v)); }
constexpr int kRegisters = 16;
#else
#error "small_m_matmul needs AVX2 + FMA or AVX-512F (x86-64); XLA's dot is used instead."
#endif

constexpr int kVectorsPerBlock = 2;
constexpr int kBlock = kLanes * kVectorsPerBlock;  // NB, columns per block.
constexpr int kMaxTileBlocks = 4;
constexpr int kLineFloats = 64 / sizeof(float);  // a 64-byte cache line
// Column blocks streamed side by side. One core reads a single sequential
// stream at ~13-15 GB/s (its miss buffers bound the lines in flight) but
// several streams at the memory floor (the L2 prefetcher runs ahead on each),
// so a call walks kStreams blocks at once, KC k-steps of each in turn.
// 4 blocks in turns of 16 k-steps measured best on a Zen 2 core (4 rows:
// 13 -> 19 GB/s; 32 k-steps lose the gain); a call whose one row tile
// covers the whole group needs no turns. The hardware prefetchers
// apparently run ahead of missing loads only (the first row tile's), so the
// later tiles (from L1) prefetch a later turn themselves (kPlan below): with
// the next turn, on a quiet 2-core Zen 2 the `make demo` target's 4- and
// 8-token calls took 0.91 and 0.79 of the time, a 16-node tree's 0.80 (one
// token: unchanged; docs/results.md).
constexpr int kStreams = 4;
constexpr int64_t kChunk = 16;

// How those prefetches are made and the rows are tiled, by the CPU's vendor
// (checked once, at load; docs/results.md has the measurements).
struct Plan {
  // The hint: non-temporal, or T0 (into L1 and L2).
  bool non_temporal;
  // How many turns ahead of the one computed a prefetch reads.
  int64_t turns_ahead;
  // Whether one- and two-row calls also go in turns of one-row tiles (the
  // first row's tile waiting on DRAM, the second's prefetching; a lone row's
  // tile prefetching itself) instead of one pass with no prefetch.
  bool single_rows_in_turns;
  // Whether every row tile prefetches an equal share of a turn's k-steps
  // (else the later tiles each prefetch all of it): the prefetches are
  // spread over the whole turn, so DRAM streams while every tile computes,
  // not only while the later ones do.
  bool tiles_share_prefetch;
  // Rows of the first row tile and of the later ones (`FirstTileRows`).
  int64_t first_tile_rows;
  int64_t tile_rows;
};
// AMD: non-temporal, measured ahead of T0 on a Zen 2 and level with it on a
// Zen 4; the next turn; one pass for one or two rows (measured there).
// Intel: T0, as a non-temporal prefetch there skips L2 (a 2-core Xeon,
// AVX-512, family 6, streamed 4-16 rows at 10 GB/s with it against 21-34
// GB/s with T0); two turns ahead and one-row turns: on that Xeon the `make
// demo` target's matmuls for 1, 2, 4 and 8 rows took about 0.8, 0.75, 0.9 and
// 0.9 of the time they took with the next turn and one pass (16 rows: the
// same); the prefetches shared by the tiles: its 4- and 8-token decoder calls
// and 16-node tree call took 0.87-0.90 of the time with the later tiles
// prefetching all (one, three turns ahead, or shares by rows: no faster); with
// AVX-512, tiles of 8 rows: its 3- to 16-row products over the `make demo`
// target's four weight shapes streamed 8-13 % faster on average than with a
// first tile of 2 rows and tiles of 12 (24 and 32 rows: level).
const Plan kPlan = [] {
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd") != 0) return Plan{true, 1, false, false, 2, kMaxRows};
  return kLanes == 16 ? Plan{false, 2, true, true, 8, 8}
                      : Plan{false, 2, true, true, 2, kMaxRows};
}();
// Below this many multiply-adds a call runs on the calling thread: waking a
// second one costs more than it saves.
constexpr int64_t kMinParallelWork = 1 << 16;
constexpr int64_t kChunksPerThread = 4;

// Column blocks one row tile multiplies per k-step. Few rows have too few
// independent FMA chains (latency 4-5 cycles), so they take several, within
// the registers: MR * NBLK * 2 accumulators, the NBLK * 2 weight vectors of a
// k step (for MR > 1: one row multiplies straight from memory) and one
// broadcast.
constexpr int BlocksAtOnce(int mr) {
  for (int nblk = kMaxTileBlocks; nblk > 1; nblk /= 2) {
    int vectors = nblk * kVectorsPerBlock;
    if (mr * vectors + (mr > 1 ? vectors : 0) + 1 <= kRegisters) return nblk;
  }
  return 1;
}

// k-steps [k0, k1) of rows [0, MR) of x (row stride K) times NBLK consecutive
// column blocks, added to the accumulators `acc` [NBLK][MR][2 vectors] kept in
// memory between calls (a store and a load per vector, exact: each output is
// still one FMA chain over k in order). With `next` (the weights a later
// turn reads in these blocks' place, its first k-step first; else null), each
// k-step k0 + i with prefetch_from <= i < prefetch_to also prefetches the
// lines that turn reads at the same offset.
template <int MR, int NBLK>
void Tile(const float* x, int64_t K, int64_t k0, int64_t k1, const float* blocks,
          float* acc, const float* next, int64_t prefetch_from, int64_t prefetch_to) {
  const int64_t stride = K * kBlock;  // floats from one block to the next
  Vec a[MR][NBLK][kVectorsPerBlock];
  for (int j = 0; j < NBLK; ++j)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < kVectorsPerBlock; ++v)
        a[r][j][v] = Load(acc + ((j * MR + r) * kVectorsPerBlock + v) * kLanes);
  for (int64_t k = k0; k < k1; ++k) {
    const float* w = blocks + k * kBlock;
    if (next != nullptr && k - k0 >= prefetch_from && k - k0 < prefetch_to)
      for (int j = 0; j < NBLK; ++j)
        for (int f = 0; f < kBlock; f += kLineFloats) {
          const char* line =
              reinterpret_cast<const char*>(next + j * stride + (k - k0) * kBlock + f);
          if (kPlan.non_temporal) {
            _mm_prefetch(line, _MM_HINT_NTA);
          } else {
            _mm_prefetch(line, _MM_HINT_T0);
          }
        }
    if (MR == 1) {
      Vec xr = Broadcast(x[k]);
      for (int j = 0; j < NBLK; ++j)
        for (int v = 0; v < kVectorsPerBlock; ++v)
          a[0][j][v] = Fma(xr, Load(w + j * stride + v * kLanes), a[0][j][v]);
    } else {
      Vec wv[NBLK][kVectorsPerBlock];
      for (int j = 0; j < NBLK; ++j)
        for (int v = 0; v < kVectorsPerBlock; ++v) {
          wv[j][v] = Load(w + j * stride + v * kLanes);
          // Loaded once into a register: otherwise GCC folds the load into
          // every row's FMA, and MR loads per vector halve the FMA rate.
          KeepInRegister(wv[j][v]);
        }
      for (int r = 0; r < MR; ++r) {
        Vec xr = Broadcast(x[r * K + k]);
        for (int j = 0; j < NBLK; ++j)
          for (int v = 0; v < kVectorsPerBlock; ++v)
            a[r][j][v] = Fma(xr, wv[j][v], a[r][j][v]);
      }
    }
  }
  for (int j = 0; j < NBLK; ++j)
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < kVectorsPerBlock; ++v)
        Store(acc + ((j * MR + r) * kVectorsPerBlock + v) * kLanes, a[r][j][v]);
}

using TileFn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, float*,
                       const float*, int64_t, int64_t);

// For each row count MR: its tile over BlocksAtOnce(MR) blocks and over one.
struct TileSet {
  int blocks;
  TileFn wide;
  TileFn narrow;
};

template <int... MR>
constexpr std::array<TileSet, sizeof...(MR)> MakeTiles(
    std::integer_sequence<int, MR...>) {
  return {TileSet{BlocksAtOnce(MR + 1), &Tile<MR + 1, BlocksAtOnce(MR + 1)>,
                  &Tile<MR + 1, 1>}...};
}
constexpr auto kTiles = MakeTiles(std::make_integer_sequence<int, kMaxRows>());

struct Problem {
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N, num_blocks;
};

// Row tiles of M > 2 rows: 2 rows first, which wait on DRAM, then tiles of
// kMaxRows (the rest last; fuller tiles are faster per FMA) that read L1 and
// prefetch meanwhile, so the first is the smallest (8 rows on AVX2: 2 + 6
// measured ahead of 6 + 2 and 4 + 4; 4 rows: 2 + 2 ahead of one tile); or,
// where the plan says so, tiles of 8 rows from the first (all tiles prefetch
// there, so none is kept small for the wait). Two rows: one tile, or two
// one-row tiles where the plan says so.
int64_t FirstTileRows(int64_t M) {
  return M == 2 && kPlan.single_rows_in_turns ? 1 : std::min<int64_t>(M, kPlan.first_tile_rows);
}
int64_t RowTiles(int64_t M) {
  return 1 + (M - FirstTileRows(M) + kPlan.tile_rows - 1) / kPlan.tile_rows;
}
int64_t TileRows(int64_t M, int64_t t) {
  const int64_t first = FirstTileRows(M);
  return t == 0 ? first
                : std::min<int64_t>(kPlan.tile_rows, M - first - (t - 1) * kPlan.tile_rows);
}

// Column blocks [first, last) for all M rows, kStreams blocks at a time: for
// each chunk of kChunk k-steps, every row tile over every block of the group,
// so the chunk's weights are read from DRAM once and by later row tiles from
// L1; the tiles prefetch a later chunk (`Plan`).
void RunBlocks(const Problem& p, int64_t first, int64_t last) {
  const int64_t tiles = RowTiles(p.M);
  // A lone row's tile prefetches for itself where the plan says so.
  const bool lone_row_prefetches = p.M == 1 && kPlan.single_rows_in_turns;
  // The group's accumulators [M][kStreams][NB], kept per thread (grown once).
  thread_local std::vector<float> accumulators;
  if (accumulators.size() < static_cast<size_t>(p.M * kStreams * kBlock))
    accumulators.resize(p.M * kStreams * kBlock);
  float* acc = accumulators.data();
  for (int64_t b = first; b < last; b += kStreams) {
    const int64_t g = std::min<int64_t>(kStreams, last - b);
    std::fill(acc, acc + p.M * g * kBlock, 0.0f);
    const bool one_call = !lone_row_prefetches && tiles == 1 && kTiles[p.M - 1].blocks >= g;
    const int64_t chunk = one_call ? p.K : kChunk;
    for (int64_t k0 = 0; k0 < p.K; k0 += chunk) {
      const int64_t k1 = std::min(p.K, k0 + chunk);
      // The same blocks' chunk turns_ahead turns on, when it is a whole one
      // (prefetching the next group's first chunks measured no faster).
      const int64_t ahead = k0 + kPlan.turns_ahead * kChunk;
      int64_t row = 0;
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t rows = TileRows(p.M, t);
        const TileSet& tile = kTiles[rows - 1];
        // This tile's accumulators: [g][rows][NB] after the earlier tiles'.
        float* tile_acc = acc + row * g * kBlock;
        const bool prefetches = (t > 0 || lone_row_prefetches || kPlan.tiles_share_prefetch) &&
                                ahead + kChunk <= p.K;
        // The k-steps of that chunk this tile prefetches: all, or its share.
        const int64_t prefetch_from = kPlan.tiles_share_prefetch ? t * kChunk / tiles : 0;
        const int64_t prefetch_to = kPlan.tiles_share_prefetch ? (t + 1) * kChunk / tiles : kChunk;
        for (int64_t j = 0; j < g;) {
          const bool wide = j + tile.blocks <= g;
          const float* next = prefetches ? p.w + ((b + j) * p.K + ahead) * kBlock : nullptr;
          (wide ? tile.wide : tile.narrow)(p.x + row * p.K, p.K, k0, k1,
                                           p.w + (b + j) * p.K * kBlock,
                                           tile_acc + j * rows * kBlock, next, prefetch_from,
                                           prefetch_to);
          j += wide ? tile.blocks : 1;
        }
        row += rows;
      }
    }
    int64_t row = 0;
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t rows = TileRows(p.M, t);
      const float* tile_acc = acc + row * g * kBlock;
      for (int64_t j = 0; j < g; ++j) {
        const int64_t col = (b + j) * kBlock;
        const int64_t columns = std::min<int64_t>(kBlock, p.N - col);
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(p.y + (row + r) * p.N + col, tile_acc + (j * rows + r) * kBlock,
                      columns * sizeof(float));
      }
      row += rows;
    }
  }
}

// One call's work, split into `chunks` contiguous ranges of column blocks.
// Any thread (the caller included) claims unclaimed chunks, so the call never
// waits on a helper that has not started: the caller does the rest itself.
struct Job {
  Problem p;
  int64_t chunks;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    int64_t c;
    while ((c = next.fetch_add(1, std::memory_order_relaxed)) < chunks) {
      RunBlocks(p, c * p.num_blocks / chunks, (c + 1) * p.num_blocks / chunks);
      done.fetch_add(1, std::memory_order_release);
    }
  }
  void Wait() {
    for (int spins = 0; done.load(std::memory_order_acquire) < chunks; ++spins) {
      if (spins < 4096) {
        _mm_pause();
      } else {
        std::this_thread::yield();
      }
    }
  }
};

ffi::Error MatmulImpl(ffi::ThreadPool xla_pool, ffi::Buffer<ffi::F32> x,
                      ffi::Buffer<ffi::F32> blocks, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto bd = blocks.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 2 || bd.size() != 3 || yd.size() != 2 || bd[2] != kBlock ||
      bd[1] != xd[1] || yd[0] != xd[0] || yd[1] > bd[0] * kBlock ||
      yd[1] <= (bd[0] - 1) * kBlock) {
    return ffi::Error::InvalidArgument(
        "small_m_matmul: expected x [M, K], blocks [ceil(N / NB), K, NB] with "
        "NB = " + std::to_string(kBlock) + " and y [M, N]; repack the weights "
        "with speculative_t5x.kernels.pack on this machine.");
  }
  Problem p{x.typed_data(), blocks.typed_data(), y->typed_data(),
            xd[0],          xd[1],               yd[1],         bd[0]};
  if (p.M == 0 || p.N == 0) return ffi::Error::Success();
  if (p.K == 0) {
    std::fill(p.y, p.y + p.M * p.N, 0.0f);
    return ffi::Error::Success();
  }
  int64_t threads = 1;
  if (p.M * p.K * p.N >= kMinParallelWork) threads = std::max<int64_t>(1, xla_pool.num_threads());
  threads = std::min(threads, p.num_blocks);
  if (threads <= 1) {
    RunBlocks(p, 0, p.num_blocks);
    return ffi::Error::Success();
  }
  auto job = std::make_shared<Job>();
  job->p = p;
  // More chunks than threads: on a shared machine a thread that is descheduled
  // holds up the call by one small chunk, not by half the work.
  job->chunks = std::min(p.num_blocks, threads * kChunksPerThread);
  // Helpers hold the job by shared_ptr: one that starts after the caller has
  // finished every chunk finds nothing to claim and returns.
  for (int64_t i = 1; i < threads; ++i) xla_pool.Schedule([job] { job->Work(); });
  job->Work();
  job->Wait();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpeculativeT5xSmallMMatmul, MatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

// The column block width NB the packed layout must use with this build.
extern "C" int64_t SpeculativeT5xSmallMBlockWidth() { return kBlock; }
