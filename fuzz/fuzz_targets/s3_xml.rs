//! The XML request bodies the S3 API reads, through s3s's deserialiser:
//! DeleteObjects, CompleteMultipartUpload, CreateBucket, PutBucketAcl.
#![no_main]

use libfuzzer_sys::fuzz_target;
use s3s::dto::{AccessControlPolicy, CompletedMultipartUpload, CreateBucketConfiguration, Delete};
use s3s::xml::{Deserialize, Deserializer};

fn parse<'a, T: Deserialize<'a>>(data: &'a [u8]) {
    let mut d = Deserializer::new(data);
    if T::deserialize(&mut d).is_ok() {
        let _ = d.expect_eof();
    }
}

fuzz_target!(|data: &[u8]| {
    parse::<Delete>(data);
    parse::<CompletedMultipartUpload>(data);
    parse::<CreateBucketConfiguration>(data);
    parse::<AccessControlPolicy>(data);
});
