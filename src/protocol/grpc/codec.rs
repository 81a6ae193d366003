//! prost's gRPC codec, except for what a request that is not valid protobuf
//! gets: such a message (a string field that is not UTF-8, such as a model
//! name) is the client's mistake, so it is INVALID_ARGUMENT, as for any other
//! bad request, where prost's codec answers INTERNAL (a server fault to
//! alerting). The generated service uses it (`build.rs`, `codec_path`).

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, DecodeBuf};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// The codec of every `inference.GRPCInferenceService` call.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(PhantomData)
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(ProstDecoder::new(BufferSettings::default()))
    }
}

/// prost's decoder, its errors made INVALID_ARGUMENT.
#[derive(Debug)]
pub struct Decoder<U>(ProstDecoder<U>);

impl<U: Message + Default> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            Status::invalid_argument(format!(
                "the request is not a valid protobuf message for this call (a string field must be UTF-8): {}",
                s.message()
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
