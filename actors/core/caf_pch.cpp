// Anchor translation unit of the shared CAF precompiled header (CMake target
// archipelago_caf_pch); targets that use CAF reuse its PCH.
