//! Legacy VHD structures (big-endian): footer, dynamic disk header, parent locators, BAT.
