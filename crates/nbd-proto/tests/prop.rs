//! Property tests: `decode(encode(x)) == x` for every message, and the parsers never panic
//! on arbitrary bytes.

use std::io::Cursor;

use nbd_proto::option::OptionReply;
use nbd_proto::reply::{Chunk, ChunkPayload, Descriptor};
use nbd_proto::{
    ClientFlags, ClientOption, Command, CommandFlags, ExportNameReply, Info, InfoRequest,
    MetaQuery, NBD_FLAG_NO_ZEROES, NBD_OPT_GO, NBD_REP_FLAG_ERROR, OptionHeader, REQUEST_LEN,
    Request, ServerGreeting, SimpleReply,
};
use proptest::prelude::*;

fn name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9@:._ -]{0,40}"
}

fn info_request() -> impl Strategy<Value = InfoRequest> {
    (name(), prop::collection::vec(any::<u16>(), 0..8))
        .prop_map(|(name, requests)| InfoRequest { name, requests })
}

fn meta_query() -> impl Strategy<Value = MetaQuery> {
    (name(), prop::collection::vec(name(), 0..6))
        .prop_map(|(export, queries)| MetaQuery { export, queries })
}

fn client_option() -> impl Strategy<Value = ClientOption> {
    prop_oneof![
        name().prop_map(ClientOption::ExportName),
        Just(ClientOption::Abort),
        Just(ClientOption::List),
        Just(ClientOption::StartTls),
        info_request().prop_map(ClientOption::Info),
        info_request().prop_map(ClientOption::Go),
        Just(ClientOption::StructuredReply),
        meta_query().prop_map(ClientOption::ListMetaContext),
        meta_query().prop_map(ClientOption::SetMetaContext),
        (12u32..).prop_map(ClientOption::Unknown),
    ]
}

fn option_reply() -> impl Strategy<Value = OptionReply> {
    prop_oneof![
        Just(OptionReply::Ack),
        (name(), name()).prop_map(|(name, description)| OptionReply::Server { name, description }),
        (any::<u64>(), any::<u16>()).prop_map(|(size, transmission_flags)| OptionReply::Info(
            Info::Export {
                size,
                transmission_flags
            }
        )),
        name().prop_map(|n| OptionReply::Info(Info::Name(n))),
        name().prop_map(|n| OptionReply::Info(Info::Description(n))),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(min, preferred, max)| {
            OptionReply::Info(Info::BlockSize {
                min,
                preferred,
                max,
            })
        }),
        (any::<u32>(), name()).prop_map(|(id, name)| OptionReply::MetaContext { id, name }),
        (1u32..12, name()).prop_map(|(c, message)| OptionReply::Error {
            code: NBD_REP_FLAG_ERROR | c,
            message
        }),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    any::<u16>().prop_map(Command::from_u16)
}

fn request() -> impl Strategy<Value = Request> {
    (
        any::<u16>(),
        command(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(f, command, cookie, offset, len)| Request {
            flags: CommandFlags(f),
            command,
            cookie,
            offset,
            len,
        })
}

fn chunk_payload() -> impl Strategy<Value = ChunkPayload> {
    prop_oneof![
        Just(ChunkPayload::None),
        (any::<u64>(), prop::collection::vec(any::<u8>(), 1..64))
            .prop_map(|(offset, data)| ChunkPayload::OffsetData { offset, data }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(offset, len)| ChunkPayload::OffsetHole { offset, len }),
        (
            any::<u32>(),
            prop::collection::vec((1u32.., 0u32..4), 1..16)
        )
            .prop_map(|(context_id, d)| ChunkPayload::BlockStatus {
                context_id,
                descriptors: d
                    .into_iter()
                    .map(|(len, flags)| Descriptor { len, flags })
                    .collect()
            }),
        (1u32.., name()).prop_map(|(error, message)| ChunkPayload::Error { error, message }),
        (1u32.., name(), any::<u64>()).prop_map(|(error, message, offset)| {
            ChunkPayload::ErrorOffset {
                error,
                message,
                offset,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn client_option_round_trips(o in client_option()) {
        let mut buf = Vec::new();
        o.encode(&mut buf);
        let h = OptionHeader::parse(&buf[..16]).unwrap();
        prop_assert_eq!(h.payload_len(), buf.len() - 16);
        prop_assert_eq!(ClientOption::parse(h, &buf[16..]).unwrap(), o);
    }

    #[test]
    fn option_reply_round_trips(r in option_reply(), option in any::<u32>()) {
        let mut buf = Vec::new();
        r.encode(option, &mut buf);
        prop_assert_eq!(OptionReply::parse(&buf).unwrap(), (option, r));
    }

    #[test]
    fn request_round_trips(r in request()) {
        let mut buf = Vec::new();
        r.encode(&mut buf);
        let head: [u8; REQUEST_LEN] = buf.try_into().unwrap();
        prop_assert_eq!(Request::parse(&head).unwrap(), r);
    }

    #[test]
    fn chunk_round_trips(payload in chunk_payload(), done in any::<bool>(), cookie in any::<u64>()) {
        let c = Chunk { done, cookie, payload };
        let mut buf = Vec::new();
        c.encode(&mut buf).unwrap();
        prop_assert_eq!(Chunk::parse(&buf).unwrap(), (c, buf.len()));
    }

    #[test]
    fn simple_reply_round_trips(error in any::<u32>(), cookie in any::<u64>()) {
        let r = SimpleReply { error, cookie };
        let mut buf = Vec::new();
        r.encode(&mut buf);
        prop_assert_eq!(SimpleReply::parse(&buf).unwrap(), r);
    }

    #[test]
    fn handshake_round_trips(hf in any::<u16>(), fixed in any::<bool>(), nz in any::<bool>(),
                             size in any::<u64>(), tf in any::<u16>()) {
        let g = ServerGreeting { handshake_flags: hf | NBD_FLAG_NO_ZEROES };
        let mut buf = Vec::new();
        g.encode(&mut buf);
        prop_assert_eq!(ServerGreeting::parse(&buf).unwrap(), g);
        let c = ClientFlags { fixed_newstyle: fixed, no_zeroes: nz };
        let mut buf = Vec::new();
        c.encode(&mut buf);
        prop_assert_eq!(ClientFlags::parse(&buf, g.handshake_flags).unwrap(), c);
        let e = ExportNameReply { size, transmission_flags: tf };
        let mut buf = Vec::new();
        e.encode(nz, &mut buf);
        prop_assert_eq!(ExportNameReply::parse(&buf).unwrap(), e);
    }

    #[test]
    fn parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), opt in any::<u32>()) {
        let _ = OptionHeader::parse(&bytes);
        let h = OptionHeader { option: opt % 16, len: bytes.len() as u32 };
        let _ = ClientOption::parse(h, &bytes);
        let _ = ClientOption::parse(OptionHeader { option: NBD_OPT_GO, len: 0 }, &bytes);
        let _ = MetaQuery::parse(&bytes);
        let _ = OptionReply::parse(&bytes);
        let _ = Chunk::parse(&bytes);
        let _ = SimpleReply::parse(&bytes);
        let _ = ServerGreeting::parse(&bytes);
        let _ = ClientFlags::parse(&bytes, 3);
        let _ = ExportNameReply::parse(&bytes);
        if let Some(head) = bytes.first_chunk::<REQUEST_LEN>() {
            let _ = Request::parse(head);
        }
        let mut cur = Cursor::new(&bytes[..]);
        while Request::check(&mut cur).is_ok() {}
    }

    #[test]
    fn check_consumes_whole_requests_only(reqs in prop::collection::vec(request(), 1..5), cut in any::<prop::sample::Index>()) {
        let mut buf = Vec::new();
        let mut ends = Vec::new();
        for r in &reqs {
            let r = Request { len: if r.command == Command::Write { r.len % 64 } else { r.len }, ..*r };
            r.encode(&mut buf);
            buf.extend(std::iter::repeat_n(0xAB, r.payload_len() as usize));
            ends.push(buf.len() as u64);
        }
        let cut = cut.index(buf.len() + 1);
        let mut cur = Cursor::new(&buf[..cut]);
        let mut seen = 0;
        while Request::check(&mut cur).is_ok() {
            prop_assert_eq!(cur.position(), ends[seen]);
            seen += 1;
        }
        prop_assert!(seen == ends.len() || ends[seen] > cut as u64);
    }
}
