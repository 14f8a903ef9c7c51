//! The body of `POST /v1/rank` as its handler receives it: decoded, or (MessagePack) framed so
//! that its documents are decoded by feature extraction itself ([`msgpack_rank::Framed`]).
//!
//! Framing changes when documents are decoded, never what a request gets back: a framed body
//! that turns out to be one the fast path does not take is decoded in full where it would have
//! been used, and a framed body's decoding errors still come before the errors that used to
//! follow the decode (see [`RankBody::or_body_error`]).

use bytes::Bytes;

use super::api::RankRequest;
use super::codec::{Format, RequestBody};
use super::error::ApiError;
use super::msgpack_rank::{self, Framed};
use super::routes::feature_matrix;
use super::store::LoadedRanker;

/// A `/v1/rank` body.
#[derive(Debug)]
pub enum RankBody {
    /// Decoded in full (JSON, or MessagePack the fast reader leaves to rmp-serde).
    Decoded(RankRequest),
    /// MessagePack read but for its documents.
    Framed(Framed),
}

impl RequestBody for RankBody {
    fn decode_body(format: Format, bytes: Bytes) -> Result<Self, ApiError> {
        if format == Format::Msgpack {
            if let Some(framed) = msgpack_rank::frame(bytes.clone()) {
                return Ok(RankBody::Framed(framed));
            }
        }
        format.decode_rank_request(&bytes).map(RankBody::Decoded)
    }
}

/// What [`RankBody::frame_documents`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// The request's fields are the ones read before framing.
    AsRead,
    /// The body had to be decoded in full, and its fields are not the ones read before (the
    /// fields after `documents` were misread: see [`msgpack_rank::frame`]): whatever was
    /// decided from [`RankBody::head`] must be decided again.
    Reread,
}

impl RankBody {
    /// Frames a framed body's documents ([`Framed::frame_documents`], in parallel on the
    /// current rayon pool: the handler calls it on the CPU pool, before feature extraction).
    /// Where they do not frame as the fields after them were read, the body is decoded in
    /// full instead.
    ///
    /// # Errors
    /// [`ApiError::BadBody`] when the body does not decode.
    pub fn frame_documents(&mut self) -> Result<Framing, ApiError> {
        let RankBody::Framed(framed) = self else {
            return Ok(Framing::AsRead);
        };
        if framed.frame_documents() {
            return Ok(Framing::AsRead);
        }
        let mut request = Format::Msgpack.decode_rank_request(framed.body())?;
        // The head has no documents.
        let documents = std::mem::take(&mut request.documents);
        let same = request == framed.head;
        request.documents = documents;
        *self = RankBody::Decoded(request);
        Ok(if same {
            Framing::AsRead
        } else {
            Framing::Reread
        })
    }

    /// The request's fields; `documents` is empty when the body is framed.
    pub fn head(&self) -> &RankRequest {
        match self {
            RankBody::Decoded(request) => request,
            RankBody::Framed(framed) => &framed.head,
        }
    }

    /// The request's documents.
    pub fn len(&self) -> usize {
        match self {
            RankBody::Decoded(request) => request.documents.len(),
            RankBody::Framed(framed) => framed.len(),
        }
    }

    /// Whether it has no documents.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole request.
    ///
    /// # Errors
    /// [`ApiError::BadBody`] when a framed body's documents do not decode.
    pub fn decoded(self) -> Result<RankRequest, ApiError> {
        match self {
            RankBody::Decoded(request) => Ok(request),
            RankBody::Framed(framed) => Format::Msgpack.decode_rank_request(framed.body()),
        }
    }

    /// The error to answer instead of `err`, met after the body was read: the body's own
    /// decoding error when its documents do not decode (that error came first when bodies
    /// were decoded in full before anything else), else `err`.
    pub fn or_body_error(&self, err: ApiError) -> ApiError {
        match self {
            RankBody::Framed(framed) => Format::Msgpack
                .decode_rank_request(framed.body())
                .err()
                .unwrap_or(err),
            RankBody::Decoded(_) => err,
        }
    }

    /// The documents as one row-major `documents × features` matrix for `loaded`: a framed
    /// body's documents decoded and extracted in one pass ([`Framed::feature_matrix`]), else,
    /// and wherever that pass declines, [`feature_matrix`] of the decoded request.
    ///
    /// # Errors
    /// As [`feature_matrix`], and [`ApiError::BadBody`] when a framed body's documents do not
    /// decode.
    pub fn feature_matrix(
        &self,
        loaded: &LoadedRanker,
        threads: usize,
    ) -> Result<Vec<f64>, ApiError> {
        match self {
            RankBody::Decoded(request) => feature_matrix(request, loaded, threads),
            RankBody::Framed(framed) => {
                let width = loaded.ranker.features.len();
                match framed.feature_matrix(loaded.fe.as_ref(), width, threads) {
                    Some(matrix) => Ok(matrix),
                    None => {
                        let request = Format::Msgpack.decode_rank_request(framed.body())?;
                        feature_matrix(&request, loaded, threads)
                    }
                }
            }
        }
    }
}
