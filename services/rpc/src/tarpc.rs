//! tarpc over uniplane: a connection's bytes ([`ByteStream`]) framed by
//! length and encoded with bincode, as a tarpc transport.
//!
//! ```rust,ignore
//! // Server, per accepted connection:
//! let t = uniplane_rpc::tarpc::transport(ByteStream::accepted(conn));
//! BaseChannel::with_defaults(t).execute(MyServer.serve()).for_each(spawn).await;
//! // Client:
//! let t = uniplane_rpc::tarpc::transport(ByteStream::connected(conn));
//! let client = MyServiceClient::new(client::Config::default(), t).spawn();
//! ```

use serde::de::DeserializeOwned;
use serde::Serialize;
use tarpc::serde_transport::Transport;
use tarpc::tokio_serde::formats::Bincode;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::ByteStream;

/// A tarpc transport over one uniplane connection.
pub type UniplaneTransport<In, Out> = Transport<ByteStream, In, Out, Bincode<In, Out>>;

/// tarpc's items over `stream`: each a length-prefixed bincode frame.
pub fn transport<In, Out>(stream: ByteStream) -> UniplaneTransport<In, Out>
where
    In: DeserializeOwned,
    Out: Serialize,
{
    tarpc::serde_transport::new(
        Framed::new(stream, LengthDelimitedCodec::new()),
        Bincode::default(),
    )
}
