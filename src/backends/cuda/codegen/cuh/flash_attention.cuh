// The fused flash-attention kernel (codegen/flash_attention_source.cpp has the design).
// Compiled by NVRTC after the prelude and these definitions, which the source function sets:
//   FA_D      head dim of q, k and v (32, 64, 96 or 128: K's fragments come 32 dims at a time)
//   FA_MASK   0 none, 1 bool mask (true keeps), 2 additive mask in the input dtype
//   FA_BF16   1 for bf16, 0 for f16; FA_TY its PTX type name ("bf16" / "f16")
//   FA_BM, FA_BN  query rows per CTA and keys per block
#define FA_LDS (FA_D + 8)  // padded rows: the 8 rows of an ldmatrix phase hit distinct banks
#define FA_STAGES (FA_D <= 64 ? 2 : 1)
#define FA_NEG_INF __int_as_float(0xff800000)
typedef unsigned short fa_u16;
typedef unsigned int fa_u32;
#if FA_MASK == 1
typedef unsigned char fa_mask_t;
#else
typedef fa_u16 fa_mask_t;
#endif
struct KilnDims {
  long long size[8];
  long long stride[8];
};

__device__ __forceinline__ float fa_to_float(fa_u16 h) {
#if FA_BF16
  return __uint_as_float(((fa_u32)h) << 16);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#endif
}

// {lo, hi} -> one register of two 16-bit floats, lo in the low half.
__device__ __forceinline__ fa_u32 fa_pack(float lo, float hi) {
  fa_u32 r;
  asm("cvt.rn." FA_TY "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ void fa_mma(float* c, fa_u32 a0, fa_u32 a1, fa_u32 a2, fa_u32 a3, fa_u32 b0, fa_u32 b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." FA_TY "." FA_TY
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
               "{%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ fa_u32 fa_smem_addr(const void* p) {
  fa_u32 a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// Starts copying rows x FA_D elements (row stride ld in memory) to shared memory (row stride
// FA_LDS) by cp.async, 16 bytes per step; rows >= valid are zero-filled (nothing is read).
// The copy is one commit group.
__device__ __forceinline__ void fa_load_tile(fa_u16* sm, const fa_u16* g, int rows, int valid, long long ld) {
  const int per_row = FA_D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < rows * per_row; i += 128) {
    const int r = i / per_row, c = (i % per_row) * 8;
    const fa_u16* src = r < valid ? g + (long long)r * ld + c : g;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(fa_smem_addr(sm + r * FA_LDS + c)), "l"(src),
                 "r"(r < valid ? 16 : 0));
  }
  asm volatile("cp.async.commit_group;");
}
#define FA_WAIT(n) asm volatile("cp.async.wait_group %0;" ::"n"(n))

extern "C" __global__ void __launch_bounds__(128)
    kiln_flash_attention(const fa_u16* __restrict__ q, const fa_u16* __restrict__ k, const fa_u16* __restrict__ v,
                         fa_u16* __restrict__ o, const fa_mask_t* __restrict__ mask, int L, int S, float scale_log2,
                         int causal, KilnDims qd, KilnDims kd, KilnDims vd, KilnDims od, KilnDims md, int brank,
                         long long mrs, long long mcs, long long q_ld, long long k_ld, long long v_ld, long long o_ld) {
  __shared__ __align__(16) fa_u16 sk_all[FA_STAGES][FA_BN * FA_LDS];
  __shared__ __align__(16) fa_u16 sv_all[FA_STAGES][FA_BN * FA_LDS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long b = blockIdx.y;
  const int m0 = blockIdx.x * FA_BM;
  long long qo = 0, ko = 0, vo = 0, oo = 0, mo = 0;
  {
    long long rem = b;
#pragma unroll
    for (int d = 7; d >= 0; --d) {  // constant indices keep the parameter structs off the stack
      if (d >= brank) continue;
      const long long i = rem % qd.size[d];
      rem /= qd.size[d];
      qo += i * qd.stride[d], ko += i * kd.stride[d], vo += i * vd.stride[d], oo += i * od.stride[d];
      mo += i * md.stride[d];
    }
  }
  q += qo + (long long)m0 * q_ld;
  k += ko;
  v += vo;
  o += oo + (long long)m0 * o_ld;

  // Q fragments, through shared memory.
  fa_u16* sq = sk_all[0];
  fa_load_tile(sq, q, FA_BM, min(FA_BM, L - m0), q_ld);
  FA_WAIT(0);
  __syncthreads();
  const int r0 = warp * 16 + g;
  fa_u32 qa[FA_D / 16][4];
#pragma unroll
  for (int kk = 0; kk < FA_D / 16; ++kk) {
    const int c = kk * 16 + t * 2;
    qa[kk][0] = *reinterpret_cast<const fa_u32*>(sq + r0 * FA_LDS + c);
    qa[kk][1] = *reinterpret_cast<const fa_u32*>(sq + (r0 + 8) * FA_LDS + c);
    qa[kk][2] = *reinterpret_cast<const fa_u32*>(sq + r0 * FA_LDS + c + 8);
    qa[kk][3] = *reinterpret_cast<const fa_u32*>(sq + (r0 + 8) * FA_LDS + c + 8);
  }
  __syncthreads();

  float acc[FA_D / 8][4];
#pragma unroll
  for (int i = 0; i < FA_D / 8; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
  float row_max[2] = {FA_NEG_INF, FA_NEG_INF}, row_sum[2] = {0.0f, 0.0f};
  const int qi[2] = {m0 + r0, m0 + r0 + 8};
  const int n_end = causal ? min(S, m0 + FA_BM) : S;
#if FA_MASK
  // Each thread's two mask rows (rows past L read row L - 1: computed, never written).
  const fa_mask_t* mrow[2] = {mask + mo + (long long)min(qi[0], L - 1) * mrs,
                              mask + mo + (long long)min(qi[1], L - 1) * mrs};
  const int mcol = (int)mcs;
#endif
  const int blocks = (n_end + FA_BN - 1) / FA_BN;
#if FA_STAGES == 2
  if (blocks > 0) {
    fa_load_tile(sk_all[0], k, FA_BN, min(FA_BN, S), k_ld);
    fa_load_tile(sv_all[0], v, FA_BN, min(FA_BN, S), v_ld);
  }
#endif

  for (int j = 0; j < blocks; ++j) {
    const int n0 = j * FA_BN;
    fa_u16* sk = sk_all[j % FA_STAGES];
    fa_u16* sv = sv_all[j % FA_STAGES];
#if FA_STAGES == 2
    // Block j + 1 into the other stage (free: the previous iteration ended with a barrier).
    const bool next = j + 1 < blocks;
    if (next) {
      const int n1 = n0 + FA_BN;
      fa_load_tile(sk_all[(j + 1) % 2], k + (long long)n1 * k_ld, FA_BN, min(FA_BN, S - n1), k_ld);
      fa_load_tile(sv_all[(j + 1) % 2], v + (long long)n1 * v_ld, FA_BN, min(FA_BN, S - n1), v_ld);
      FA_WAIT(3);  // K of block j done; V of j and K, V of j + 1 may be in flight
    } else {
      FA_WAIT(1);
    }
#else
    fa_load_tile(sk, k + (long long)n0 * k_ld, FA_BN, min(FA_BN, S - n0), k_ld);
    fa_load_tile(sv, v + (long long)n0 * v_ld, FA_BN, min(FA_BN, S - n0), v_ld);
    FA_WAIT(1);
#endif
    __syncthreads();

    float sc[FA_BN / 8][4];
    // K's B fragments by ldmatrix.x4: lane l addresses key row (l & 7) of matrix l / 8, the
    // matrices being head dims kk*16 + {0, 8, 16, 24}: {b0, b1} of k-steps kk and kk + 1.
    const fa_u32 krow = fa_smem_addr(sk + (lane & 7) * FA_LDS + (lane >> 3) * 8);
#pragma unroll
    for (int nt = 0; nt < FA_BN / 8; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < FA_D / 16; kk += 2) {
        fa_u32 b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"(krow + (nt * 8 * FA_LDS + kk * 16) * 2));
        fa_mma(sc[nt], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
        fa_mma(sc[nt], qa[kk + 1][0], qa[kk + 1][1], qa[kk + 1][2], qa[kk + 1][3], b2, b3);
      }
    }

    float mx[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int nt = 0; nt < FA_BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = e >> 1, kj = n0 + nt * 8 + t * 2 + (e & 1), i = qi[row];
        float x = sc[nt][e] * scale_log2;
        bool keep = kj < S && (!causal || kj <= i);
#if FA_MASK == 1
        keep = keep && mrow[row][kj * mcol] != 0;
#elif FA_MASK == 2
        if (keep) x = fmaf(fa_to_float(mrow[row][kj * mcol]), 1.4426950408889634f, x);
#endif
        x = keep ? x : FA_NEG_INF;
        sc[nt][e] = x;
        mx[row] = fmaxf(mx[row], x);
      }
    }
    float safe[2], alpha[2], part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int row = 0; row < 2; ++row) {
      mx[row] = fmaxf(mx[row], __shfl_xor_sync(0xffffffffu, mx[row], 1));
      mx[row] = fmaxf(mx[row], __shfl_xor_sync(0xffffffffu, mx[row], 2));
      safe[row] = mx[row] == FA_NEG_INF ? 0.0f : mx[row];
      alpha[row] = exp2f(row_max[row] - safe[row]);  // 0 while the old max is -inf
      row_max[row] = mx[row];
    }
#pragma unroll
    for (int nt = 0; nt < FA_BN / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[nt][e] - safe[e >> 1]);
        sc[nt][e] = p;
        part[e >> 1] += p;
      }
    }
#pragma unroll
    for (int row = 0; row < 2; ++row) row_sum[row] = row_sum[row] * alpha[row] + part[row];
#pragma unroll
    for (int dn = 0; dn < FA_D / 8; ++dn) {
      acc[dn][0] *= alpha[0], acc[dn][1] *= alpha[0];
      acc[dn][2] *= alpha[1], acc[dn][3] *= alpha[1];
    }

#if FA_STAGES == 2
    if (next) FA_WAIT(2);
    else FA_WAIT(0);  // V of block j
#else
    FA_WAIT(0);
#endif
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < FA_BN / 16; ++kk) {
      const fa_u32 a0 = fa_pack(sc[2 * kk][0], sc[2 * kk][1]), a1 = fa_pack(sc[2 * kk][2], sc[2 * kk][3]);
      const fa_u32 a2 = fa_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                   a3 = fa_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      // V's B fragments by ldmatrix.trans: lanes 0..15 address key rows kk*16 + 0..15.
      const fa_u32 vrow = fa_smem_addr(sv + (kk * 16 + (lane & 15)) * FA_LDS);
#pragma unroll
      for (int dn = 0; dn < FA_D / 8; ++dn) {
        fa_u32 b0, b1;
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
                     : "=r"(b0), "=r"(b1)
                     : "r"(vrow + dn * 16));
        fa_mma(acc[dn], a0, a1, a2, a3, b0, b1);
      }
    }
    __syncthreads();
  }

  float inv[2];
#pragma unroll
  for (int row = 0; row < 2; ++row) {
    float l = row_sum[row];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv[row] = l > 0.0f ? 1.0f / l : 0.0f;
  }
#pragma unroll
  for (int dn = 0; dn < FA_D / 8; ++dn) {
    const int c = dn * 8 + t * 2;
    if (qi[0] < L) *reinterpret_cast<fa_u32*>(o + r0 * o_ld + c) = fa_pack(acc[dn][0] * inv[0], acc[dn][1] * inv[0]);
    if (qi[1] < L)
      *reinterpret_cast<fa_u32*>(o + (r0 + 8) * o_ld + c) = fa_pack(acc[dn][2] * inv[1], acc[dn][3] * inv[1]);
  }
}
