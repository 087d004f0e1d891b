// Comms over a stream link (TCP and loopback): the link's accepting end becomes a Receiver,
// its connecting end a Sender (plugin/protocol/).
import type { StreamLink } from '../protocol/link';
import { Receiver } from '../protocol/receiver';
import { Sender } from '../protocol/sender';
import type { CommHooks } from './transport';

export const sendComm = (link: StreamLink, h: CommHooks) => new Sender(link, h.complete, h.name);
export const recvComm = (link: StreamLink, h: CommHooks) => new Receiver(link, h.complete, h.name);
