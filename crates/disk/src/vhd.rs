//! Legacy VHD images (read-only): fixed, dynamic and differencing.
