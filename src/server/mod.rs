//! server: placeholder until its issue lands.
