// The window geometry the pool kernels (kernels/pool.cpp) take by value: PoolGeometry of
// src/ops/access.h, fourteen long longs in its order. Expects no macros.
struct Geom {
  long long planes, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw, C;
};
