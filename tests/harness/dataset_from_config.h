#pragma once
// The dataset entry points of dataset/dataset.h and dataset/tokenizer.h
// taking a whole-run Config, as the trainer calls them (through
// dataset_spec), for the tests that build their datasets from a Config.
#include <memory>
#include <optional>

#include "dataset/dataset.h"
#include "dataset/tokenizer.h"
#include "launch/config.h"

namespace st::dataset {

inline std::unique_ptr<Dataset> make_dataset(const Config& c) { return make_dataset(dataset_spec(c)); }
inline std::unique_ptr<Dataset> make_validation_dataset(const Config& c) {
  return make_validation_dataset(dataset_spec(c));
}
inline std::optional<Tokenizer> load_data_tokenizer(const Config& c) { return load_data_tokenizer(dataset_spec(c)); }

}  // namespace st::dataset
