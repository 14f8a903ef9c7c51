//! The body of `POST /v1/rank` as its handler receives it: decoded, or (MessagePack) framed so
//! that its documents are decoded by feature extraction itself ([`msgpack_rank::Framed`]).
//!
//! Framing changes when documents are decoded, never what a request gets back: a framed body
//! that turns out to be one the fast path does not take is decoded in full where it would have
//! been used, and a framed body's decoding errors still come before the errors that used to
//! follow the decode (see [`RankBody::body_error`]).

use bytes::Bytes;

use std::collections::HashMap;

use super::format::{BodyError, Format};
use super::msgpack_rank::{self, Framed};
use super::{FeatureValues, RankDocument, RankRequest, MAX_FEATURE_VALUES};
use crate::gpu::pinned::PinnedPool;
use crate::gpu::GpuError;
use crate::rank::cut_input;
use crate::rank::engine::RowSource;
use crate::rank::fe::{fill_rows_in_chunks, GatherMap};
use crate::rank::gpu::layout::FeLayout;
use crate::rank::store::LoadedRanker;

/// A `/v1/rank` body.
#[derive(Debug)]
pub enum RankBody {
    /// Decoded in full (JSON, or MessagePack the fast reader leaves to rmp-serde).
    Decoded(RankRequest),
    /// MessagePack read but for its documents.
    Framed(Framed),
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
    /// A body of `format`: MessagePack framed when the fast reader takes it, else decoded in
    /// full.
    ///
    /// # Errors
    /// [`BodyError::BadBody`] when it does not decode.
    pub fn decode(format: Format, bytes: Bytes) -> Result<RankBody, BodyError> {
        if format == Format::Msgpack {
            if let Some(framed) = msgpack_rank::frame(bytes.clone()) {
                return Ok(RankBody::Framed(framed));
            }
        }
        format.decode_rank_request(&bytes).map(RankBody::Decoded)
    }

    /// Frames a framed body's documents ([`Framed::frame_documents`], in parallel on the
    /// current rayon pool over at most `threads`: the handler calls it on the CPU pool, before
    /// feature extraction).
    /// Where they do not frame as the fields after them were read, the body is decoded in
    /// full instead.
    ///
    /// # Errors
    /// [`BodyError::BadBody`] when the body does not decode.
    pub fn frame_documents(&mut self, threads: usize) -> Result<Framing, BodyError> {
        let RankBody::Framed(framed) = self else {
            return Ok(Framing::AsRead);
        };
        if framed.frame_documents(threads) {
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
    /// [`BodyError::BadBody`] when a framed body's documents do not decode.
    pub fn decoded(self) -> Result<RankRequest, BodyError> {
        match self {
            RankBody::Decoded(request) => Ok(request),
            RankBody::Framed(framed) => Format::Msgpack.decode_rank_request(framed.body()),
        }
    }

    /// The body's own decoding error, when a framed body's documents do not decode: a
    /// caller that refuses the request after reading it answers this error instead (it came
    /// first when bodies were decoded in full before anything else).
    pub fn body_error(&self) -> Option<BodyError> {
        match self {
            RankBody::Framed(framed) => Format::Msgpack.decode_rank_request(framed.body()).err(),
            RankBody::Decoded(_) => None,
        }
    }

    /// The documents as one row-major `documents × features` matrix for `loaded`: a framed
    /// body's documents decoded and extracted in one pass ([`Framed::feature_matrix`]), else,
    /// and wherever that pass declines, [`feature_matrix`] of the decoded request.
    ///
    /// # Errors
    /// As [`feature_matrix`], and [`BodyError::BadBody`] when a framed body's documents do not
    /// decode.
    pub fn feature_matrix(
        &self,
        loaded: &LoadedRanker,
        threads: usize,
    ) -> Result<Vec<f64>, BodyError> {
        check_matrix_size(self.len(), loaded)?;
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

/// A body is the ranking engine's row source: framed on the CPU pool, then its documents'
/// features extracted there, in one pass for a framed body.
impl RowSource for RankBody {
    type Error = BodyError;

    fn len(&self) -> usize {
        RankBody::len(self)
    }

    fn rows(
        &mut self,
        loaded: &LoadedRanker,
        threads: usize,
    ) -> Result<Option<Vec<f64>>, BodyError> {
        match self.frame_documents(threads)? {
            Framing::AsRead => self.feature_matrix(loaded, threads).map(Some),
            Framing::Reread => Ok(None),
        }
    }

    /// A framed body that names the query and its statistics: hit documents, most likely.
    fn may_give_hits(&self) -> bool {
        let head = self.head();
        matches!(self, RankBody::Framed(_)) && head.query.is_some() && head.stats.is_some()
    }

    /// A framed body's documents laid out as they are read ([`Framed::fe_layouts`]; framed
    /// first only when they fill more than one layout); a body decoded in full, or one that
    /// does not lay out as read, gives its rows instead.
    fn hit_layouts(
        &mut self,
        gather: &GatherMap,
        max_docs: usize,
        threads: usize,
        pinned: Option<&PinnedPool>,
    ) -> Option<Result<Vec<FeLayout>, GpuError>> {
        let RankBody::Framed(framed) = self else {
            return None;
        };
        if framed.len() > max_docs && !framed.frame_documents(threads) {
            return None;
        }
        framed.fe_layouts(gather, max_docs, threads, pinned)
    }
}

/// Refuses a request whose feature matrix would hold more than [`MAX_FEATURE_VALUES`].
fn check_matrix_size(documents: usize, loaded: &LoadedRanker) -> Result<(), BodyError> {
    let width = loaded.ranker.features.len();
    match documents.checked_mul(width) {
        Some(values) if values <= MAX_FEATURE_VALUES => Ok(()),
        _ => Err(BodyError::Invalid(format!(
            "documents: {documents} documents × {width} features of ranker {:?} is more than \
             the {MAX_FEATURE_VALUES} feature values one request may make",
            cut_input(&loaded.name)
        ))),
    }
}

/// Why document `i` has no row: neither or both of `features` and `hits`, or a feature vector
/// of the wrong length.
fn shape_error(i: usize, doc: &RankDocument, loaded: &LoadedRanker) -> Option<BodyError> {
    let width = loaded.ranker.features.len();
    let message = match (&doc.features, &doc.hits) {
        (Some(_), Some(_)) => format!("documents[{i}]: give `features` or `hits`, not both"),
        (None, None) => format!("documents[{i}]: needs `features` or `hits`"),
        (Some(FeatureValues::Vector(values)), None) if values.len() != width => format!(
            "documents[{i}].features: expected {width} values (ranker {:?}'s features), got {}",
            loaded.name,
            values.len()
        ),
        _ => return None,
    };
    Some(BodyError::Invalid(message))
}

/// The request's documents as one row-major `n_docs × n_features` matrix. Every document's
/// shape is checked before the matrix is sized, so that a body of empty documents (a byte
/// each in MessagePack) is refused without a row for each.
///
/// # Errors
/// [`BodyError::Invalid`] naming the document index and field: the lowest document of the
/// wrong shape, else the lowest whose features or hits are invalid.
pub fn feature_matrix(
    request: &RankRequest,
    loaded: &LoadedRanker,
    threads: usize,
) -> Result<Vec<f64>, BodyError> {
    check_matrix_size(request.documents.len(), loaded)?;
    if let Some(err) =
        (request.documents.iter().enumerate()).find_map(|(i, d)| shape_error(i, d, loaded))
    {
        return Err(err);
    }
    let width = loaded.ranker.features.len();
    let mut matrix = vec![f64::NAN; request.documents.len() * width];
    // Feature extraction is ~1-2 µs a hit document: spread a request's documents over rayon's
    // pool, in chunks of at least 64 (the hand-off costs a few µs).
    fill_rows_in_chunks(
        &request.documents,
        &mut matrix,
        width,
        threads,
        64,
        |first, docs, rows| fill_rows(request, loaded, first, docs, rows),
    )?;
    Ok(matrix)
}

/// Fills `rows` (`docs.len() × n_features`) from `docs`, the request's documents from index
/// `first` on (for error messages).
fn fill_rows(
    request: &RankRequest,
    loaded: &LoadedRanker,
    first: usize,
    docs: &[RankDocument],
    rows: &mut [f64],
) -> Result<(), BodyError> {
    let names = &loaded.ranker.features;
    let width = names.len();
    let mut by_name: Option<HashMap<&str, usize>> = None;
    let invalid = |msg: String| BodyError::Invalid(msg);
    for (i, doc) in (first..).zip(docs) {
        let row = &mut rows[(i - first) * width..(i - first + 1) * width];
        match (&doc.features, &doc.hits) {
            // Refused by `shape_error` before the matrix was sized.
            (Some(_), Some(_)) | (None, None) => {}
            (Some(FeatureValues::Vector(values)), None) => {
                for (slot, value) in row.iter_mut().zip(values) {
                    *slot = value.unwrap_or(f64::NAN);
                }
            }
            (Some(FeatureValues::Named(values)), None) => {
                let index = by_name.get_or_insert_with(|| {
                    names
                        .iter()
                        .enumerate()
                        .map(|(j, n)| (n.as_str(), j))
                        .collect()
                });
                for (name, value) in values {
                    let Some(&j) = index.get(name.as_str()) else {
                        let name = cut_input(name);
                        return Err(invalid(format!(
                            "documents[{i}].features.{name}: unknown feature: ranker {:?} has no feature {name:?}",
                            loaded.name
                        )));
                    };
                    row[j] = value.unwrap_or(f64::NAN);
                }
            }
            (None, Some(hits)) => {
                let (Some(query), Some(stats)) = (&request.query, &request.stats) else {
                    return Err(invalid(format!(
                        "documents[{i}].hits: a request with hit documents needs `query` and `stats`"
                    )));
                };
                let resolver = loaded.fe.as_ref().map_err(|err| {
                    invalid(format!(
                        "documents[{i}].hits: ranker {:?} cannot take hit documents, send `features`: {err}",
                        loaded.name
                    ))
                })?;
                resolver
                    .extract(query, stats, hits, row)
                    .map_err(|err| invalid(format!("documents[{i}].hits: {}", err.at_index(i))))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::api::MAX_DOCUMENTS;

    /// The bundled medium ranker and a synthetic request of `docs` hit documents.
    fn medium_request(docs: usize) -> (Arc<LoadedRanker>, RankRequest) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rankers");
        let store = crate::rank::store::RankerStore::open(&dir, 1 << 30).unwrap();
        let loaded = store.get("medium").unwrap();
        let request =
            crate::bench::replay::synth_requests("medium", &loaded.ranker, docs, 1, None, 7)
                .pop()
                .unwrap();
        (loaded, request)
    }

    fn encoded(format: Format, body: &serde_json::Value) -> Bytes {
        Bytes::from(match format {
            Format::Json => serde_json::to_vec(body).unwrap(),
            Format::Msgpack => rmp_serde::to_vec_named(body).unwrap(),
        })
    }

    /// A body of more than `MAX_DOCUMENTS` documents is refused as it is decoded (a
    /// MessagePack document can be one byte and decodes to a few hundred).
    #[test]
    fn more_than_max_documents_are_refused_while_decoding() {
        let documents =
            |n| serde_json::json!({"ranker": "small", "documents": vec![serde_json::json!({}); n]});
        for format in [Format::Json, Format::Msgpack] {
            let err = RankBody::decode(format, encoded(format, &documents(MAX_DOCUMENTS + 1)))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!(
                    "expected an array of at most {MAX_DOCUMENTS} documents"
                )),
                "{err}"
            );
            assert_eq!(
                RankBody::decode(format, encoded(format, &documents(MAX_DOCUMENTS)))
                    .unwrap()
                    .len(),
                MAX_DOCUMENTS
            );
        }
    }

    /// Documents × features past `MAX_FEATURE_VALUES` are refused before the matrix is sized,
    /// and so is a document of the wrong shape however many documents come before it.
    #[test]
    fn the_matrix_is_sized_only_for_documents_that_fit_and_have_rows() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::rank::store::RankerStore::open(dir.path(), 1 << 30).unwrap();
        let width = 1000;
        let features: Vec<String> = (0..width).map(|f| format!("f{f}")).collect();
        let ranker = serde_json::json!({
            "format": "rankserve-ranker", "version": 1, "features": features,
            "inputs": [{"type": "linear", "feature": "f0", "slope": 1.0, "intercept": 0.0}],
            "layers": [{"weights": [[1.0]], "bias": [0.0], "activation": "identity"}]
        });
        let loaded = store
            .put("wide", ranker.to_string().as_bytes(), None)
            .unwrap();
        let request = |docs: usize, last: serde_json::Value| {
            let mut documents = vec![serde_json::json!({"features": {}}); docs - 1];
            documents.push(last);
            serde_json::json!({"ranker": "wide", "documents": documents})
        };
        let fits = MAX_FEATURE_VALUES / width;
        for format in [Format::Json, Format::Msgpack] {
            let rows = |body| {
                let mut body = RankBody::decode(format, encoded(format, &body)).unwrap();
                loop {
                    if let Some(rows) = body.rows(&loaded, 2)? {
                        return Ok::<_, BodyError>(rows);
                    }
                }
            };
            let named = serde_json::json!({"features": {"f1": 2.0}});
            assert_eq!(
                rows(request(fits, named.clone())).unwrap().len(),
                fits * width
            );
            let err = rows(request(fits + 1, named)).unwrap_err().to_string();
            assert!(err.starts_with(&format!("documents: {} documents × {width} features of ranker \"wide\" is more than the {MAX_FEATURE_VALUES}", fits + 1)), "{err}");
            let err = rows(request(fits, serde_json::json!({})))
                .unwrap_err()
                .to_string();
            assert_eq!(
                err,
                format!("documents[{}]: needs `features` or `hits`", fits - 1)
            );
        }
    }

    #[test]
    fn feature_matrix_in_chunks_equals_one_pass_and_names_the_lowest_bad_document() {
        let (loaded, mut request) = medium_request(1000);
        let width = loaded.ranker.features.len();
        let matrix = feature_matrix(&request, &loaded, 4).unwrap();
        let mut one_pass = vec![f64::NAN; matrix.len()];
        fill_rows(&request, &loaded, 0, &request.documents, &mut one_pass).unwrap();
        assert_eq!(matrix.len(), 1000 * width);
        assert!(matrix
            .iter()
            .zip(&one_pass)
            .all(|(a, b)| a.to_bits() == b.to_bits()));

        for bad in [900, 300] {
            request.documents[bad].features = Some(FeatureValues::Vector(vec![]));
        }
        let err = feature_matrix(&request, &loaded, 4)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("documents[300]: give `features` or `hits`"),
            "{err}"
        );
    }
}
