//! select: placeholder until its issue lands.
