//===- safetensors.cpp - safetensors I/O, atomic writes -------------------===//
#include "runtime/safetensors.h"

#include "runtime/error.h"
#include "runtime/json.h"
#include "runtime/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ap::rt {

//===----------------------------------------------------------------------===//
// dtypes
//===----------------------------------------------------------------------===//

namespace {
struct DTypeRow {
  StDType type;
  const char *name;
  size_t size;
};
constexpr DTypeRow kDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},
    {StDType::I8, "I8", 1},     {StDType::I16, "I16", 2},
    {StDType::U16, "U16", 2},   {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::I32, "I32", 4},
    {StDType::U32, "U32", 4},   {StDType::F32, "F32", 4},
    {StDType::F64, "F64", 8},   {StDType::I64, "I64", 8},
    {StDType::U64, "U64", 8}};

/// Headers beyond this are certainly corrupt (the Rust reference caps at
/// 100 MB too), and refusing them avoids huge allocations on garbage.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
} // namespace

size_t stDTypeSize(StDType t) {
  for (const DTypeRow &r : kDTypes)
    if (r.type == t)
      return r.size;
  return 0;
}

const char *stDTypeName(StDType t) {
  for (const DTypeRow &r : kDTypes)
    if (r.type == t)
      return r.name;
  return "?";
}

bool parseStDType(const std::string &name, StDType &out) {
  for (const DTypeRow &r : kDTypes)
    if (name == r.name) {
      out = r.type;
      return true;
    }
  return false;
}

uint64_t StTensorInfo::numElements() const {
  uint64_t n = 1;
  for (int64_t d : shape)
    n *= uint64_t(d);
  return n;
}

//===----------------------------------------------------------------------===//
// JSON
//===----------------------------------------------------------------------===//

std::string jsonQuote(const std::string &s) {
  // A log line or metrics file stays valid JSON whatever the bytes: invalid
  // UTF-8 becomes U+FFFD here (files that must read back use dumpJson, which
  // refuses it).
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

//===----------------------------------------------------------------------===//
// Atomic file writes
//===----------------------------------------------------------------------===//

namespace {

std::string dirOf(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

/// A temporary file next to the destination; removed unless committed.
class TempFile {
public:
  TempFile(const std::string &path, uint64_t failAfter)
      : path_(path), failAfter_(failAfter) {
    tmp_ = path + ".tmp." + std::to_string(::getpid());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      fail("checkpoint: cannot create '", tmp_, "': ", std::strerror(errno));
  }
  ~TempFile() {
    if (fd_ >= 0)
      ::close(fd_);
    if (!committed_)
      ::unlink(tmp_.c_str());
  }
  void write(const void *data, size_t n) {
    const char *p = static_cast<const char *>(data);
    while (n > 0) {
      if (written_ >= failAfter_)
        fail("checkpoint: simulated failure after ", written_,
             " bytes while writing '", path_, "'");
      size_t chunk =
          std::min<uint64_t>({n, size_t(1) << 26, failAfter_ - written_});
      ssize_t w = ::write(fd_, p, chunk);
      if (w < 0) {
        if (errno == EINTR)
          continue;
        fail("checkpoint: write to '", tmp_,
             "' failed: ", std::strerror(errno));
      }
      p += w;
      n -= size_t(w);
      written_ += uint64_t(w);
    }
  }
  void commit(bool sync) {
    if (sync && ::fsync(fd_) != 0)
      fail("checkpoint: fsync of '", tmp_, "' failed: ", std::strerror(errno));
    if (::close(fd_) != 0) {
      fd_ = -1;
      fail("checkpoint: close of '", tmp_, "' failed: ", std::strerror(errno));
    }
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      fail("checkpoint: rename '", tmp_, "' -> '", path_,
           "' failed: ", std::strerror(errno));
    committed_ = true;
    if (sync) {
      // The rename itself is durable only once the directory is synced.
      int dfd =
          ::open(dirOf(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
      }
    }
  }

private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  uint64_t failAfter_;
  uint64_t written_ = 0;
};

} // namespace

void writeFileAtomically(const std::string &path, const std::string &bytes,
                         bool sync) {
  TempFile f(path, UINT64_MAX);
  f.write(bytes.data(), bytes.size());
  f.commit(sync);
}

//===----------------------------------------------------------------------===//
// Writer
//===----------------------------------------------------------------------===//

void SafetensorsWriter::add(const std::string &name, StDType dtype,
                            const std::vector<int64_t> &shape, const void *data,
                            size_t bytes) {
  if (name.empty() || name == "__metadata__")
    fail("safetensors: invalid tensor name '", name, "'");
  dumpJson(Json(name), "safetensors: tensor name '" + name + "'");
  for (const Entry &e : entries_)
    if (e.info.name == name)
      fail("safetensors: tensor '", name, "' added twice");
  Entry e;
  e.info.name = name;
  e.info.dtype = dtype;
  e.info.shape = shape;
  for (int64_t d : shape)
    if (d < 0)
      fail("safetensors: tensor '", name, "' has a negative dimension");
  uint64_t expect = e.info.numElements() * stDTypeSize(dtype);
  if (expect != bytes)
    fail("safetensors: tensor '", name, "' is ", bytes, " bytes but ",
         stDTypeName(dtype), " of its shape needs ", expect);
  if (bytes > 0 && data == nullptr)
    fail("safetensors: tensor '", name, "' has no data");
  e.data = data;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::setMetadata(const std::string &key,
                                    const std::string &value) {
  // Refused here, where the entry is known, rather than at write().
  dumpJson(Json(key), "safetensors: metadata key '" + key + "'");
  dumpJson(Json(value), "safetensors: metadata '" + key + "'");
  metadata_[key] = value;
}

std::vector<SafetensorsWriter::Entry> SafetensorsWriter::ordered() const {
  // Wider element types first: every tensor then starts at a multiple of its
  // element size (the data section itself starts 8-byte aligned), so readers
  // can map tensors in place.
  std::vector<Entry> out = entries_;
  std::stable_sort(out.begin(), out.end(), [](const Entry &a, const Entry &b) {
    return stDTypeSize(a.info.dtype) > stDTypeSize(b.info.dtype);
  });
  uint64_t off = 0;
  for (Entry &e : out) {
    uint64_t n = e.info.numElements() * stDTypeSize(e.info.dtype);
    e.info.begin = off;
    e.info.end = off + n;
    off += n;
  }
  return out;
}

std::string SafetensorsWriter::checksum() const {
  Sha256 h;
  for (const Entry &e : ordered())
    h.update(e.data, size_t(e.info.bytes()));
  return Sha256::hex(h.finish());
}

std::string SafetensorsWriter::header(const WriteOptions &options) const {
  std::map<std::string, std::string> meta = metadata_;
  if (!options.checksumKey.empty())
    meta[options.checksumKey] = checksum();
  Json root = Json::object();
  if (!meta.empty())
    root["__metadata__"] = meta;
  for (const Entry &e : ordered())
    root[e.info.name] = {
        {"dtype", stDTypeName(e.info.dtype)},
        {"shape", e.info.shape},
        {"data_offsets", Json::array({e.info.begin, e.info.end})}};
  std::string json = dumpJson(root, "safetensors: header");
  // Pad with spaces (valid JSON whitespace) so the data section is 8-byte
  // aligned, as the reference implementation does.
  while (json.size() % 8 != 0)
    json += ' ';
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i)
    out[i] = char((n >> (8 * i)) & 0xff);
  return out + json;
}

void SafetensorsWriter::write(const std::string &path,
                              const WriteOptions &options) const {
  std::string head = header(options);
  TempFile f(path, options.failAfterBytes);
  f.write(head.data(), head.size());
  for (const Entry &e : ordered())
    f.write(e.data, size_t(e.info.bytes()));
  f.commit(options.sync);
}

//===----------------------------------------------------------------------===//
// Reader
//===----------------------------------------------------------------------===//

SafetensorsFile::SafetensorsFile(SafetensorsFile &&o) noexcept {
  *this = std::move(o);
}

SafetensorsFile &SafetensorsFile::operator=(SafetensorsFile &&o) noexcept {
  if (this == &o)
    return *this;
  if (mapBase_)
    ::munmap(mapBase_, mapSize_);
  path_ = std::move(o.path_);
  mapBase_ = o.mapBase_;
  mapSize_ = o.mapSize_;
  o.mapBase_ = nullptr;
  o.mapSize_ = 0;
  bool owned = !o.bytes_.empty() && o.image_ == o.bytes_.data();
  bytes_ = std::move(o.bytes_);
  size_t dataOff = o.dataSection_ ? size_t(o.dataSection_ - o.image_) : 0;
  image_ = owned ? bytes_.data() : o.image_;
  imageSize_ = o.imageSize_;
  dataSection_ = o.dataSection_ ? image_ + dataOff : nullptr;
  dataBytes_ = o.dataBytes_;
  tensors_ = std::move(o.tensors_);
  byName_ = std::move(o.byName_);
  metadata_ = std::move(o.metadata_);
  o.image_ = nullptr;
  o.dataSection_ = nullptr;
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapBase_)
    ::munmap(mapBase_, mapSize_);
}

SafetensorsFile SafetensorsFile::open(const std::string &path) {
  SafetensorsFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    fail("safetensors: cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    fail("safetensors: cannot stat '", path, "': ", std::strerror(e));
  }
  f.mapSize_ = size_t(st.st_size);
  if (f.mapSize_ < 8) {
    ::close(fd);
    fail("safetensors: '", path, "' is truncated: ", f.mapSize_,
         " bytes, shorter than the 8-byte header length");
  }
  void *p = ::mmap(nullptr, f.mapSize_, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  ::close(fd);
  if (p == MAP_FAILED)
    fail("safetensors: cannot mmap '", path, "': ", std::strerror(e));
  f.mapBase_ = p;
  f.image_ = static_cast<const uint8_t *>(p);
  f.imageSize_ = f.mapSize_;
  f.parse();
  return f;
}

SafetensorsFile SafetensorsFile::fromBytes(std::vector<uint8_t> bytes,
                                           const std::string &what) {
  SafetensorsFile f;
  f.path_ = what;
  f.bytes_ = std::move(bytes);
  f.image_ = f.bytes_.data();
  f.imageSize_ = f.bytes_.size();
  if (f.imageSize_ < 8)
    fail("safetensors: '", what, "' is truncated: ", f.imageSize_,
         " bytes, shorter than the 8-byte header length");
  f.parse();
  return f;
}

void SafetensorsFile::parse() {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t(image_[i]) << (8 * i);
  if (n > kMaxHeaderBytes)
    fail("safetensors: '", path_, "' declares a ", n,
         "-byte header: not a safetensors file or corrupt");
  if (8 + n > imageSize_)
    fail("safetensors: '", path_, "' is truncated: header of ", n,
         " bytes but the file has ", imageSize_);
  std::string json(reinterpret_cast<const char *>(image_ + 8), size_t(n));
  Json root = parseJson(json, "safetensors: header of '" + path_ + "'");
  if (!root.is_object())
    fail("safetensors: header of '", path_, "' is not a JSON object");
  dataSection_ = image_ + 8 + n;
  dataBytes_ = imageSize_ - 8 - n;

  for (const auto &[name, v] : root.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        fail("safetensors: '", path_, "': __metadata__ is not an object");
      for (const auto &[k, mv] : v.items()) {
        if (!mv.is_string())
          fail("safetensors: '", path_, "': metadata '", k,
               "' is not a string");
        metadata_[k] = mv.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string &why) {
      fail("safetensors: '", path_, "': tensor '", name, "': ", why);
    };
    if (!v.is_object())
      bad("entry is not an object");
    StTensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string() ||
        !parseStDType(dt->get<std::string>(), t.dtype))
      bad("missing or unknown dtype");
    auto shape = v.find("shape");
    if (shape == v.end() || !shape->is_array())
      bad("missing shape");
    uint64_t elems = 1;
    for (const Json &d : *shape) {
      // Non-negative integers only: nlohmann reads "2" as unsigned, "-2" as
      // signed, "2.0" and integers beyond 64 bits as floating point.
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 48))
        bad("bad dimension in shape");
      uint64_t dim = d.get<uint64_t>();
      t.shape.push_back(int64_t(dim));
      if (dim != 0 && elems > UINT64_MAX / dim)
        bad("shape overflows");
      elems *= dim;
    }
    auto offs = v.find("data_offsets");
    if (offs == v.end() || !offs->is_array() || offs->size() != 2 ||
        !(*offs)[0].is_number_unsigned() || !(*offs)[1].is_number_unsigned())
      bad("missing or bad data_offsets");
    t.begin = (*offs)[0].get<uint64_t>();
    t.end = (*offs)[1].get<uint64_t>();
    if (t.end < t.begin)
      bad("missing or bad data_offsets");
    uint64_t esz = stDTypeSize(t.dtype);
    if (elems > UINT64_MAX / esz || t.end - t.begin != elems * esz)
      bad("data_offsets span " + std::to_string(t.end - t.begin) +
          " bytes but dtype x shape needs " + std::to_string(elems * esz));
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const StTensorInfo &a, const StTensorInfo &b) {
              return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
            });
  // Tensors must tile the data section exactly: no overlap, no holes, and
  // the file must hold all of it (a shorter file is a truncated write).
  uint64_t expect = 0;
  for (const StTensorInfo &t : tensors_) {
    if (t.begin != expect)
      fail("safetensors: '", path_, "': tensor '", t.name, "' starts at ",
           t.begin, ", expected ", expect, " (overlapping or missing data)");
    expect = t.end;
  }
  if (expect > dataBytes_)
    fail("safetensors: '", path_, "' is truncated: tensors need ", expect,
         " data bytes but only ", dataBytes_, " are present");
  if (expect < dataBytes_)
    fail("safetensors: '", path_, "' has ", dataBytes_ - expect,
         " bytes after the last tensor (corrupt or appended data)");
  for (size_t i = 0; i < tensors_.size(); ++i)
    byName_[tensors_[i].name] = i;
}

const StTensorInfo *SafetensorsFile::find(const std::string &name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : &tensors_[it->second];
}

std::string SafetensorsFile::meta(const std::string &key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? std::string() : it->second;
}

void SafetensorsFile::verifyChecksum(const std::string &key) const {
  std::string want = meta(key);
  if (want.empty())
    fail("safetensors: '", path_, "' has no checksum (metadata '", key, "')");
  std::string got = sha256Hex(dataSection_, size_t(dataBytes_));
  if (got != want)
    fail("safetensors: '", path_,
         "' is corrupt: SHA-256 of the data section is ", got,
         " but the header records ", want);
}

} // namespace ap::rt
