//! Configuration: file + flags + environment, validated once at start-up.
