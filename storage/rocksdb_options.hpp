#pragma once
// The RocksDB options a snapshot store is opened with, for the few places that
// must match them exactly (bench snapshot's plain-RocksDB baseline). Includes
// RocksDB's headers: keep it out of widely included files.

#include <rocksdb/options.h>

#include "storage/kv_store.hpp"

namespace archipelago::storage {

rocksdb::DBOptions db_options(open_mode mode);
/// A column's family options (today the same for every column).
rocksdb::ColumnFamilyOptions family_options(column c);
/// The same by RocksDB family name ("default" is meta's; an unknown name gets meta's).
rocksdb::ColumnFamilyOptions family_options(const std::string& name);

}  // namespace archipelago::storage
