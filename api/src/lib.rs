//! dcpserve api
