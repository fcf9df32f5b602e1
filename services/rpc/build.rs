//! Compiles `proto/echo.proto` (the Echo service of the examples, tests
//! and benchmark) with tonic's code generator when the `tonic` feature is
//! on. Needs `protoc` (Debian: protobuf-compiler).

fn main() {
    println!("cargo:rerun-if-changed=proto/echo.proto");
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "tonic")]
    if let Err(e) = tonic_prost_build::configure()
        .bytes(".uniplane.echo")
        .compile_protos(&["proto/echo.proto"], &["proto"])
    {
        panic!("compiling proto/echo.proto (is protoc installed?): {e}");
    }
}
