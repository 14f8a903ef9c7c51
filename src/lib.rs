//! rankserve: a learning-to-rank scoring accelerator.
//!
//! A search frontend calls rankserve over HTTP (MessagePack or JSON) to select candidate
//! documents from a compressed inverted index (the *document stage*, [`select`] over [`index`])
//! and rank them with machine-learned rankers (the *ranking stage*, [`rank`]): feature
//! extraction, model-input transforms, decision trees and neural-net layers. Every stage has a
//! complete CPU implementation, which is the reference, and a GPU implementation that must agree
//! with it ([`gpu`] holds the device runtime).
//!
//! Dependencies point one way: [`server`] at the top; [`select`] and [`rank`] below it;
//! [`index`] and [`gpu`] at the bottom.

pub mod api;
pub mod backend;
pub mod bench;
pub mod broker;
pub mod config;
pub mod gpu;
pub mod index;
pub mod rank;
pub mod select;
pub mod server;
