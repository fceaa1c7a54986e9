#include "workload/fashion_mnist.hpp"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>

#include "common/errno_text.hpp"
#include "fedwan/error.hpp"

namespace fedwan::workload {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned byte, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned byte, 1 dimension
constexpr uint32_t kRows = 28;
constexpr uint32_t kCols = 28;
// Far above the 60000 of the real set; bounds the allocation a corrupt
// header could ask for (1M x 784 bytes).
constexpr uint32_t kMaxSamples = 1000000;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw ConfigError("Fashion-MNIST file " + path + ": " + why +
                    " (install the data set with `apt-get install dataset-fashion-mnist`, or "
                    "point the data directory at a copy of the original IDX .gz files)");
}

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzHandle = std::unique_ptr<gzFile_s, GzCloser>;

// One IDX file read through zlib; every call is checked.
class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)) {
    errno = 0;
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) {
      fail(path_,
           std::string("cannot be opened: ") + (errno != 0 ? errno_text(errno) : "out of memory"));
    }
    if (gzbuffer(file_.get(), 1u << 20) != 0) fail(path_, "gzbuffer failed");
  }

  void read(void* out, size_t n, const char* what) {
    auto* p = static_cast<unsigned char*>(out);
    while (n > 0) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(n, INT_MAX));
      const int got = gzread(file_.get(), p, want);
      if (got < 0) {
        int code = Z_OK;
        const char* msg = gzerror(file_.get(), &code);
        fail(path_, std::string("read error in ") + what + ": " + (msg ? msg : "unknown"));
      }
      if (got == 0) fail(path_, std::string("truncated in ") + what);
      p += got;
      n -= static_cast<size_t>(got);
    }
  }

  uint32_t read_be32(const char* what) {
    std::array<unsigned char, 4> b{};
    read(b.data(), b.size(), what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  // The file must end exactly after the payload the header announced, and
  // the gzip stream must close cleanly (gzclose reports a cut-off stream).
  void expect_end() {
    unsigned char extra = 0;
    const int got = gzread(file_.get(), &extra, 1);
    if (got < 0) fail(path_, "read error after the payload");
    if (got > 0) fail(path_, "has trailing bytes after the announced payload");
    const int rc = gzclose(file_.release());
    if (rc != Z_OK)
      fail(path_, "gzip stream did not close cleanly (code " + std::to_string(rc) + ")");
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  GzHandle file_;
};

uint32_t read_count(IdxReader& r, uint32_t magic, const char* kind) {
  const uint32_t got = r.read_be32("magic number");
  if (got != magic) {
    char text[64];
    std::snprintf(text, sizeof text, " file (magic 0x%08x, expected 0x%08x)", got, magic);
    fail(r.path(), std::string("is not an IDX ") + kind + text);
  }
  const uint32_t count = r.read_be32("sample count");
  if (count == 0 || count > kMaxSamples) {
    fail(r.path(), "announces " + std::to_string(count) + " samples (expected 1.." +
                       std::to_string(kMaxSamples) + ")");
  }
  return count;
}

std::vector<uint8_t> read_images(const std::string& path, uint32_t* count) {
  IdxReader r(path);
  *count = read_count(r, kImagesMagic, "image");
  const uint32_t rows = r.read_be32("row count");
  const uint32_t cols = r.read_be32("column count");
  if (rows != kRows || cols != kCols) {
    fail(path,
         "has " + std::to_string(rows) + "x" + std::to_string(cols) + " images (expected 28x28)");
  }
  std::vector<uint8_t> pixels(size_t{*count} * kRows * kCols);
  r.read(pixels.data(), pixels.size(), "pixel data");
  r.expect_end();
  return pixels;
}

std::vector<uint8_t> read_labels(const std::string& path) {
  IdxReader r(path);
  const uint32_t count = read_count(r, kLabelsMagic, "label");
  std::vector<uint8_t> labels(count);
  r.read(labels.data(), labels.size(), "label data");
  r.expect_end();
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] >= kFashionMnistClasses) {
      fail(path, "label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                     " is outside 0..9");
    }
  }
  return labels;
}

}  // namespace

FashionMnistData load_fashion_mnist(FashionMnistSet which, const std::string& dir) {
  const std::string prefix = dir + "/" + (which == FashionMnistSet::kTrain ? "train" : "t10k");
  const std::string images_path = prefix + "-images-idx3-ubyte.gz";
  const std::string labels_path = prefix + "-labels-idx1-ubyte.gz";

  uint32_t count = 0;
  const std::vector<uint8_t> pixels = read_images(images_path, &count);
  FashionMnistData data;
  data.label_bytes = read_labels(labels_path);
  if (data.label_bytes.size() != count) {
    fail(labels_path, "holds " + std::to_string(data.label_bytes.size()) + " labels but " +
                          images_path + " holds " + std::to_string(count) + " images");
  }

  const int64_t n = count;
  data.images = torch::empty({n, 1, kRows, kCols}, torch::kFloat32);
  float* dst = data.images.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / (255.0 * kFashionMnistStd));
  const float shift = static_cast<float>(kFashionMnistMean / kFashionMnistStd);
  for (size_t i = 0; i < pixels.size(); ++i) dst[i] = static_cast<float>(pixels[i]) * scale - shift;

  data.labels = torch::empty({n}, torch::kInt64);
  int64_t* lab = data.labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) lab[i] = data.label_bytes[static_cast<size_t>(i)];
  return data;
}

}  // namespace fedwan::workload
