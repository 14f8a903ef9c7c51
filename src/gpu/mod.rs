//! gpu: placeholder until its issue lands.
