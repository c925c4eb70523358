// Random contents for the tests of saved cuDNN tactics (conv and attention states).
#pragma once

#include <random>
#include <string>

namespace kiln::test {

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
