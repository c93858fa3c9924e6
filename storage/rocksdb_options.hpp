#pragma once
// The RocksDB options a snapshot store is opened with, for the few places that
// must match them exactly (bench snapshot's plain-RocksDB baseline). Includes
// RocksDB's headers: keep it out of widely included files.

#include <rocksdb/options.h>

#include "storage/kv_store.hpp"

namespace archipelago::storage {

rocksdb::DBOptions db_options(open_mode mode);
rocksdb::ColumnFamilyOptions family_options();

}  // namespace archipelago::storage
