//! The generated messages, clients and servers of package `pipewise.v1`.

tonic::include_proto!("pipewise.v1");
