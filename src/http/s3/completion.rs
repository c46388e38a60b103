//! The checksum of an object completed from parts, as S3 makes it.
//!
//! CreateMultipartUpload may name an algorithm and a type:
//! - `COMPOSITE` (the default, and what SDKs ask for): the checksum of each
//!   part, then the checksum of those checksums' bytes end to end, written
//!   `<base64>-<parts>`;
//! - `FULL_OBJECT` (CRC algorithms only; the one type of CRC64NVME): the
//!   checksum of the whole object's bytes.
//!
//! Completion reads the assembled object back anyway (for its SHA-256), so
//! both are computed from the bytes as stored, part by part, never taken
//! from what clients declared. What the Complete request declares is
//! checked against them: each part's checksum (as UploadPart answered it),
//! the object's checksum and its size. Any difference refuses the
//! completion. An upload created without an algorithm takes the algorithm
//! of the checksums the Complete request declares, if any.

use base64::Engine as _;
use s3s::checksum::ChecksumHasher;
use s3s::dto::{Checksum, ChecksumAlgorithm, ChecksumType, CompleteMultipartUploadInput, CreateMultipartUploadInput};
use s3s::{S3Result, s3_error};

use super::body::{declared, field, hasher_for};
use crate::catalog::{CHECKSUM_HEADER_PREFIX, ObjectRecord};
use crate::store::{CompletionChecksum, StoreError};

/// The upload record's headers that keep CreateMultipartUpload's choice.
/// (The store leaves every `x-amz-checksum-` header of an upload out of
/// the object it completes.)
const ALGORITHM_HEADER: &str = "x-amz-checksum-algorithm";
const TYPE_HEADER: &str = "x-amz-checksum-type";

/// The header name of an algorithm: `CRC32` is `x-amz-checksum-crc32`.
fn header_of(algorithm: &str) -> Option<&'static str> {
    super::body::ALGORITHMS.iter().copied().find(|h| h[CHECKSUM_HEADER_PREFIX.len()..].eq_ignore_ascii_case(algorithm))
}

/// The header name of an algorithm a request asks for; one whose
/// checksums are not computed here is refused, never ignored.
pub fn header_for(algorithm: &str) -> S3Result<&'static str> {
    header_of(algorithm).ok_or_else(|| {
        s3_error!(
            NotImplemented,
            "the checksum algorithm {algorithm:?} is not supported: it may be CRC32, CRC32C, CRC64NVME, SHA1 or SHA256"
        )
    })
}

/// CreateMultipartUpload's algorithm and type, checked as S3 does, as the
/// upload record's headers.
pub fn chosen(input: &CreateMultipartUploadInput) -> S3Result<Vec<(String, String)>> {
    let Some(algorithm) = &input.checksum_algorithm else {
        return match &input.checksum_type {
            Some(_) => Err(s3_error!(InvalidRequest, "x-amz-checksum-type needs an x-amz-checksum-algorithm")),
            None => Ok(Vec::new()),
        };
    };
    let name = algorithm.as_str().to_ascii_uppercase();
    header_for(&name)?;
    let crc = name.starts_with("CRC");
    let kind = match input.checksum_type.as_ref().map(|t| t.as_str()) {
        None if name == "CRC64NVME" => ChecksumType::FULL_OBJECT,
        None => ChecksumType::COMPOSITE,
        Some(ChecksumType::FULL_OBJECT) if crc => ChecksumType::FULL_OBJECT,
        Some(ChecksumType::COMPOSITE) if name != "CRC64NVME" => ChecksumType::COMPOSITE,
        Some(other) => {
            return Err(s3_error!(InvalidRequest, "the checksum type {other:?} does not go with the algorithm {name}"));
        }
    };
    Ok(vec![(ALGORITHM_HEADER.to_string(), name), (TYPE_HEADER.to_string(), kind.to_string())])
}

/// An upload's algorithm and type, as its record's headers keep them.
pub fn of_upload(headers: &[(String, String)]) -> (Option<ChecksumAlgorithm>, Option<ChecksumType>) {
    let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    (header(ALGORITHM_HEADER).map(ChecksumAlgorithm::from), header(TYPE_HEADER).map(ChecksumType::from))
}

/// The header name of the algorithm an upload's parts are checksummed
/// with, if it chose one.
pub fn part_algorithm(headers: &[(String, String)]) -> Option<&'static str> {
    headers.iter().find(|(n, _)| n == ALGORITHM_HEADER).and_then(|(_, v)| header_of(v))
}

/// The one checksum `c` holds, by header name; more than one is refused.
fn declared_in(c: &Checksum, what: &str) -> Result<Option<(&'static str, String)>, StoreError> {
    let mut found = super::body::ALGORITHMS.iter().filter_map(|name| Some((*name, field(c, name)?)));
    let first = found.next();
    if found.next().is_some() {
        return Err(StoreError::BadRequest(format!("{what} declares more than one checksum")));
    }
    Ok(first)
}

/// The checksum a completion makes.
struct Completion {
    /// Header name of the algorithm.
    header: &'static str,
    composite: bool,
    /// The listed parts: number, size, and the checksum the request
    /// declares for it.
    parts: Vec<(u32, u64, Option<String>)>,
    /// The part being read back, and its bytes so far.
    current: usize,
    fed: u64,
    part: ChecksumHasher,
    /// The parts' checksums end to end (composite), or the whole object's
    /// hasher (full object).
    joined: Vec<u8>,
    whole: ChecksumHasher,
    declared_whole: Option<String>,
    declared_size: Option<i64>,
}

impl Completion {
    /// The completion of `input` for an upload whose record is `upload`;
    /// `None` when neither the upload nor the request names a checksum.
    fn new(input: &CompleteMultipartUploadInput, upload: &ObjectRecord) -> Result<Option<Completion>, StoreError> {
        let listed = input.multipart_upload.as_ref().and_then(|m| m.parts.as_deref()).unwrap_or_default();
        let declared_whole = declared_in(&declared!(input), "the request")?;
        let mut declared_parts = Vec::with_capacity(listed.len());
        for p in listed {
            declared_parts.push(declared_in(&declared!(p), &format!("part {}", p.part_number.unwrap_or(0)))?);
        }
        let (algorithm, kind) = of_upload(&upload.headers);
        let (header, kind) = match algorithm {
            Some(a) => {
                let header = header_of(a.as_str()).ok_or_else(|| {
                    StoreError::Internal(format!("the upload's checksum algorithm {:?} is unknown", a.as_str()))
                })?;
                (header, kind.map_or(ChecksumType::COMPOSITE.to_string(), |k| k.as_str().to_string()))
            }
            // No algorithm chosen at the start: the request's own, checked
            // on the whole object if it declares one, else on the parts.
            None => match (&declared_whole, declared_parts.iter().flatten().next()) {
                (Some((h, _)), _) => (*h, ChecksumType::FULL_OBJECT.to_string()),
                (None, Some((h, _))) => (*h, ChecksumType::COMPOSITE.to_string()),
                (None, None) => return Ok(None),
            },
        };
        if let Some(asked) = &input.checksum_type
            && asked.as_str() != kind
        {
            return Err(StoreError::BadRequest(format!(
                "the upload's checksum type is {kind}, not {:?}",
                asked.as_str()
            )));
        }
        let mismatch = |what: &str, other: &str| {
            StoreError::BadRequest(format!("{what} declares {other}, but the upload's checksums are {header}"))
        };
        if let Some((h, _)) = &declared_whole
            && *h != header
        {
            return Err(mismatch("the request", h));
        }
        let mut parts = Vec::with_capacity(listed.len());
        for (p, declared) in listed.iter().zip(declared_parts) {
            let number = p.part_number.unwrap_or(0);
            let value = match declared {
                Some((h, _)) if h != header => return Err(mismatch(&format!("part {number}"), h)),
                d => d.map(|(_, v)| v),
            };
            parts.push((u32::try_from(number).unwrap_or(0), 0, value));
        }
        Ok(Some(Completion {
            header,
            composite: kind == ChecksumType::COMPOSITE,
            parts,
            current: 0,
            fed: 0,
            part: hasher_for([header].into_iter()),
            joined: Vec::new(),
            whole: hasher_for([header].into_iter()),
            declared_whole: declared_whole.map(|(_, v)| v),
            declared_size: input.mpu_object_size,
        }))
    }

    /// Ends the parts whose every byte has been read back (empty ones
    /// included), checking each against what the request declared.
    fn end_full_parts(&mut self) -> Result<(), StoreError> {
        while let Some((number, size, declared)) = self.parts.get(self.current) {
            if self.fed < *size {
                break;
            }
            let computed = std::mem::replace(&mut self.part, hasher_for([self.header].into_iter())).finalize();
            let value = field(&computed, self.header).unwrap_or_default();
            if let Some(declared) = declared
                && declared.trim() != value
            {
                return Err(StoreError::InvalidPart(format!(
                    "part {number} holds bytes whose {} is {value}, not the declared {declared}",
                    self.header
                )));
            }
            if self.composite {
                self.joined.extend(base64::engine::general_purpose::STANDARD.decode(&value).unwrap_or_default());
            }
            self.current += 1;
            self.fed = 0;
        }
        Ok(())
    }
}

/// What a Complete request declares of the object's size
/// (`x-amz-mp-object-size`) against what its parts hold.
fn check_size(declared: Option<i64>, size: u64) -> Result<(), StoreError> {
    match declared {
        Some(declared) if u64::try_from(declared).ok() != Some(size) => Err(StoreError::BadRequest(format!(
            "the parts hold {size} bytes, not the {declared} of x-amz-mp-object-size"
        ))),
        _ => Ok(()),
    }
}

/// The checks of completing `input` for an upload whose record is
/// `upload`: its checksums ([`Completion`]), or without any the size it
/// declares alone.
pub fn checks(
    input: &CompleteMultipartUploadInput,
    upload: &ObjectRecord,
) -> Result<Option<Box<dyn CompletionChecksum>>, StoreError> {
    Ok(match Completion::new(input, upload)? {
        Some(completion) => Some(Box::new(completion)),
        None => input.mpu_object_size.map(|declared| Box::new(SizeOnly { declared, size: 0 }) as _),
    })
}

/// A completion with a declared size and no checksum.
struct SizeOnly {
    declared: i64,
    /// What the parts hold.
    size: u64,
}

impl CompletionChecksum for SizeOnly {
    fn part(&mut self, _: u32, record: &ObjectRecord) -> Result<(), StoreError> {
        self.size += record.size;
        Ok(())
    }

    fn update(&mut self, _: &[u8]) -> Result<(), StoreError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<Option<(String, String)>, StoreError> {
        check_size(Some(self.declared), self.size).map(|()| None)
    }
}

impl CompletionChecksum for Completion {
    fn part(&mut self, number: u32, record: &ObjectRecord) -> Result<(), StoreError> {
        match self.parts.iter_mut().find(|(n, _, _)| *n == number) {
            Some(slot) => slot.1 = record.size,
            None => return Err(StoreError::Internal(format!("part {number} was not in the request"))),
        }
        Ok(())
    }

    fn update(&mut self, mut bytes: &[u8]) -> Result<(), StoreError> {
        if !self.composite {
            self.whole.update(bytes);
        }
        loop {
            self.end_full_parts()?;
            let Some((_, size, _)) = self.parts.get(self.current) else {
                break;
            };
            if bytes.is_empty() {
                break;
            }
            let take = ((size - self.fed) as usize).min(bytes.len());
            self.part.update(&bytes[..take]);
            self.fed += take as u64;
            bytes = &bytes[take..];
        }
        match bytes.is_empty() {
            true => Ok(()),
            false => Err(StoreError::Internal("the object read back is longer than its parts".into())),
        }
    }

    fn finish(&mut self) -> Result<Option<(String, String)>, StoreError> {
        self.end_full_parts()?;
        if self.current < self.parts.len() {
            return Err(StoreError::Internal("the object read back is shorter than its parts".into()));
        }
        check_size(self.declared_size, self.parts.iter().map(|(_, s, _)| s).sum())?;
        let value = if self.composite {
            let mut over = hasher_for([self.header].into_iter());
            over.update(&self.joined);
            format!("{}-{}", field(&over.finalize(), self.header).unwrap_or_default(), self.parts.len())
        } else {
            field(&std::mem::take(&mut self.whole).finalize(), self.header).unwrap_or_default()
        };
        // A composite checksum may be declared without its `-N`, as some
        // SDKs send it; S3 takes either.
        let suffix = format!("-{}", self.parts.len());
        if let Some(declared) = &self.declared_whole
            && declared.trim() != value
            && !(self.composite && value.strip_suffix(&suffix) == Some(declared.trim()))
        {
            return Err(StoreError::BadDigest { hash: self.header, declared: declared.clone(), actual: value });
        }
        Ok(Some((self.header.to_string(), value)))
    }
}

#[cfg(test)]
mod tests {
    use s3s::dto::{CompletedMultipartUpload, CompletedPart};

    use super::*;
    use crate::engine::Digest;

    fn record(size: u64, headers: Vec<(String, String)>) -> ObjectRecord {
        ObjectRecord {
            key: "k".into(),
            size,
            parts: Vec::new(),
            etag: String::new(),
            sha256: Digest([0; 32]),
            content_type: String::new(),
            modified: 0,
            metadata: Vec::new(),
            headers,
            body: None,
        }
    }

    fn crc32(bytes: &[u8]) -> String {
        let mut h = hasher_for(["x-amz-checksum-crc32"].into_iter());
        h.update(bytes);
        h.finalize().checksum_crc32.unwrap()
    }

    /// Completes parts of these sizes, read back in chunks of `chunk`
    /// bytes, each part listed with its right CRC32 but `wrong`.
    fn complete(sizes: &[usize], chunk: usize, kind: &str, wrong: Option<u32>) -> Result<String, StoreError> {
        let bytes: Vec<u8> = (0..sizes.iter().sum::<usize>()).map(|i| (i * 7 % 251) as u8).collect();
        let mut parts = Vec::new();
        let mut at = 0;
        for (i, size) in sizes.iter().enumerate() {
            let n = i as i32 + 1;
            let crc = if wrong == Some(n as u32) { crc32(b"other") } else { crc32(&bytes[at..at + size]) };
            parts.push(CompletedPart { part_number: Some(n), checksum_crc32: Some(crc), ..Default::default() });
            at += size;
        }
        let input = CompleteMultipartUploadInput {
            multipart_upload: Some(CompletedMultipartUpload { parts: Some(parts) }),
            ..Default::default()
        };
        let upload = record(0, vec![(ALGORITHM_HEADER.into(), "CRC32".into()), (TYPE_HEADER.into(), kind.into())]);
        let mut c = Completion::new(&input, &upload).unwrap().unwrap();
        for (i, size) in sizes.iter().enumerate() {
            c.part(i as u32 + 1, &record(*size as u64, Vec::new()))?;
        }
        for piece in bytes.chunks(chunk) {
            c.update(piece)?;
        }
        Ok(c.finish()?.unwrap().1)
    }

    #[test]
    fn a_declared_size_is_checked_without_checksums() {
        let declare = |size| CompleteMultipartUploadInput { mpu_object_size: size, ..Default::default() };
        let upload = record(0, Vec::new());
        assert!(checks(&declare(None), &upload).unwrap().is_none());
        for (declared, holds) in [(17, true), (16, false), (-1, false)] {
            let mut c = checks(&declare(Some(declared)), &upload).unwrap().unwrap();
            c.part(1, &record(10, Vec::new())).unwrap();
            c.part(2, &record(7, Vec::new())).unwrap();
            c.update(&[0; 17]).unwrap();
            let finished = c.finish();
            assert_eq!(finished.is_ok(), holds, "{declared}: {finished:?}");
            assert!(finished.is_err() || finished.unwrap().is_none(), "no checksum to store");
        }
    }

    #[test]
    fn composite_and_full_object_checksums_follow_the_parts_whatever_the_chunks() {
        let sizes = [10, 7, 0];
        let bytes: Vec<u8> = (0..17).map(|i| (i * 7 % 251) as u8).collect();
        let mut joined = Vec::new();
        for (a, b) in [(0, 10), (10, 17), (17, 17)] {
            joined.extend(base64::engine::general_purpose::STANDARD.decode(crc32(&bytes[a..b])).unwrap());
        }
        let composite = format!("{}-3", crc32(&joined));
        for chunk in [1, 3, 10, 17, 64] {
            assert_eq!(complete(&sizes, chunk, ChecksumType::COMPOSITE, None).unwrap(), composite, "chunks of {chunk}");
            assert_eq!(complete(&sizes, chunk, ChecksumType::FULL_OBJECT, None).unwrap(), crc32(&bytes));
        }
        for part in [1, 2, 3] {
            let e = complete(&sizes, 4, ChecksumType::COMPOSITE, Some(part)).unwrap_err();
            assert!(matches!(&e, StoreError::InvalidPart(m) if m.starts_with(&format!("part {part} "))), "{e}");
        }
    }
}
