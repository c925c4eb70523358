// Random contents for the tests of saved cuDNN tactics (conv and attention states).
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace kiln::test {

// Up to 5 (knob type, value) pairs.
inline std::vector<std::pair<int32_t, int64_t>> random_knobs(std::mt19937& rng) {
  std::vector<std::pair<int32_t, int64_t>> knobs;
  for (int i = int(rng() % 6); i > 0; --i) knobs.emplace_back(int32_t(rng() % 46), int64_t(rng() % 1000) - 3);
  return knobs;
}

// Half the time empty, else a serialized plan of any bytes (NUL included).
inline std::string random_plan_json(std::mt19937& rng) {
  std::string json;
  if (rng() % 2 == 0) {
    json = "{\"plan\":";
    for (int i = int(rng() % 40); i > 0; --i) json.push_back(char(rng() % 256));
  }
  return json;
}

}  // namespace kiln::test
