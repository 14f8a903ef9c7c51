//! index: placeholder until its issue lands.
